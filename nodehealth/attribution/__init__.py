"""Whose work a GPU fault hit: the pods (kubelet PodResources) and Slurm jobs behind a GPU finding."""
