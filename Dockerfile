# The nodehealth agent image: `docker build -t nodehealth .` (deploy/ runs it as a DaemonSet).
# Debian's Python, so that Debian's pyverbs (RDMA: rdma-bw, RDMA netcheck, the periodic bandwidth
# tests) runs with it; NVML comes from the host driver through the NVIDIA container runtime, and
# nothing NVIDIA is baked in. The Debian packages (deploy/image/packages) and the install steps
# (deploy/image/install.sh) are the ones tests/test_image.py runs in a chroot built by mmdebstrap from
# the same packages: no container registry is needed to prove the image's contents run
# `nodehealth check` (deploy/README.md, "The image").
FROM python:3.11-slim-bookworm AS wheels
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY nodehealth ./nodehealth
COPY collectors ./collectors
COPY checks ./checks
COPY deploy/image/wheels.sh /usr/local/bin/
RUN wheels.sh python3 . /wheels

FROM debian:bookworm-slim
COPY deploy/image/packages deploy/image/install.sh /tmp/image/
RUN apt-get update \
    && grep -v '^#' /tmp/image/packages | xargs apt-get install -y --no-install-recommends \
    && rm -rf /var/lib/apt/lists/*
COPY --from=wheels /wheels /wheels
RUN sh /tmp/image/install.sh && rm -rf /tmp/image
# Python writes no bytecode at run time: the root filesystem is read-only in the DaemonSet.
ENV PATH=/opt/nodehealth/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
EXPOSE 9456 9457
ENTRYPOINT ["nodehealth"]
CMD ["daemon", "--root", "/host"]
