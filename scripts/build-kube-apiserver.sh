#!/usr/bin/env bash
# Build (or reuse from ~/.cache/fracgpu) kube-apiserver 1.20.2 for the end-to-end suite; see
# scripts/build-kube-components.sh for the recipe. The last line printed is the binary's path:
#   APISERVER=$(scripts/build-kube-apiserver.sh | tail -n1)
set -euo pipefail
FRACGPU_BUILD_LOG_NAME=build-kube-apiserver \
  exec bash "$(dirname "$0")/build-kube-components.sh" kube-apiserver
