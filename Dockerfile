# The nodehealth agent image: `docker build -t nodehealth .` (deploy/ runs it as a DaemonSet).
# NVML comes from the host driver through the NVIDIA container runtime; nothing NVIDIA is baked in.
FROM python:3.12-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY nodehealth ./nodehealth
COPY collectors ./collectors
COPY checks ./checks
# k8s: the Kubernetes client; hang: py-spy, for the hang detection the shipped config turns on;
# probes: grpcio and protobuf for the pingmesh agent and the controller.
RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[k8s,hang,probes]'

FROM python:3.12-slim
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index /wheels/*.whl && rm -rf /wheels
# Python writes no bytecode at run time: the root filesystem is read-only in the DaemonSet.
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
EXPOSE 9456 9457
ENTRYPOINT ["nodehealth"]
CMD ["daemon", "--root", "/host"]
