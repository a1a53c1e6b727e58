# fracgpu webhook image: the admission webhook (`fracgpu serve`), the certificate manager
# (`fracgpu-certs ensure|run`) and the kubectl plugin, from this repository.
# Build from the repository root:  docker build -f docker/webhook.Dockerfile -t fracgpu-webhook .

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
# The package installs all components' modules; this image runs only the webhook's and
# certs' entry points.
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-compile /wheels/*.whl && rm -rf /wheels
# Unprivileged, matching the chart's runAsUser (65532); the root filesystem is read-only.
USER 65532:65532
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
EXPOSE 8443
ENTRYPOINT ["fracgpu"]
CMD ["serve"]
