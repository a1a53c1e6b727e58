# fracgpu node agent image: `fracgpu-agent` plus the preload shim it installs on each node
# (/usr/local/fracgpu/lib/libfracgpu.so, the agent's --shim-source default).
# Build from the repository root:  docker build -f docker/agent.Dockerfile -t fracgpu-agent .

# The shim is built for the same C library as the nodes' containers will load it into:
# bookworm's glibc 2.36 symbols; older distributions in workloads need an older base here.
FROM debian:bookworm-slim AS shim
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev make \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY shim/ shim/
RUN make -C shim build/libfracgpu.so

FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY fracgpu/ fracgpu/
COPY webhook/ webhook/
COPY agent/ agent/
COPY certs/ certs/
COPY bench/ bench/
# `fracgpu demo`'s example cluster and pods, installed as the wheel's data files.
COPY examples/ examples/
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim-bookworm
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-compile /wheels/*.whl && rm -rf /wheels
COPY --from=shim /src/shim/build/libfracgpu.so /usr/local/fracgpu/lib/libfracgpu.so
# The driver (libnvidia-ml.so.1, libcuda.so.1) is not in the image: the NVIDIA container
# runtime mounts the node driver's copy (NVIDIA_DRIVER_CAPABILITIES=compute,utility, set
# by the chart).
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
EXPOSE 9400
ENTRYPOINT ["fracgpu-agent"]
