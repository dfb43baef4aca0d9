#!/bin/sh
# Builds the wheels of nodehealth and of what its image needs, into DIR: k8s (the Kubernetes client),
# hang (py-spy), probes (grpcio, for pingmesh), attribution (grpcio and protobuf, for the kubelet's
# PodResources), analysis (numpy). Run with the image's Python version (3.11).
#   deploy/image/wheels.sh PYTHON SOURCE DIR
set -eu
"$1" -m pip wheel --quiet --no-cache-dir --wheel-dir "$3" "$2[k8s,hang,probes,attribution,analysis]"
