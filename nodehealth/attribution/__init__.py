"""Whose work a GPU fault hit: the pods (the kubelet's PodResources) and Slurm jobs behind a GPU finding.

A feature package: defaults (the `attribution` section and its checks), gpus (placing device ids on
GPUs), kubelet (the PodResources client), slurm_jobs (GRES indices, listpids, job cgroups), evidence
(what a finding carries), notices (what faces show), attributor (one round per pass). Importing it
costs nothing: grpc only when the kubelet is asked.
"""
