#!/usr/bin/env bash
# Build (or reuse from ~/.cache/fracgpu) the node tier's Kubernetes 1.20.2 binaries: kubelet,
# kube-scheduler and kube-controller-manager, from the same Debian source tree and recipe as
# kube-apiserver (scripts/build-kube-components.sh). Prints the three paths, one per line.
# A cold build is ~10 min on 2 cores (progress is printed every minute); a warm run reuses
# the cached binaries in well under a second.
set -euo pipefail
FRACGPU_BUILD_LOG_NAME=build-kube-node \
  exec bash "$(dirname "$0")/build-kube-components.sh" kubelet kube-scheduler kube-controller-manager
