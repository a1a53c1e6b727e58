#!/usr/bin/env bash
# Set up a fresh machine for fracgpu: Python venv with the project, the C shim, and
# (with --e2e) etcd, containerd and a kube-apiserver, kubelet, kube-scheduler and
# kube-controller-manager built from Debian's source package (cached in ~/.cache/fracgpu).
set -euo pipefail
cd "$(dirname "$0")/.."

want_e2e=0
for arg in "$@"; do
  case "$arg" in
    --e2e) want_e2e=1 ;;
    *) echo "setup.sh: unknown option $arg (allowed: --e2e)" >&2; exit 2 ;;
  esac
done

if ! command -v make >/dev/null || ! command -v cc >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq build-essential
fi

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[dev]'

if [ -f shim/Makefile ]; then
  make -s -C shim
fi

if [ "$want_e2e" = 1 ]; then
  bash scripts/install-system-deps.sh
  # A cold build of the four binaries takes ~12 min on 2 cores; the build scripts print a
  # progress line every minute. Warm runs reuse ~/.cache/fracgpu in well under a second.
  echo "setup: building kube-apiserver (cached after the first run)"
  apiserver=$(bash scripts/build-kube-apiserver.sh | tail -n 1)
  echo "kube-apiserver: $apiserver"
  echo "setup: building kubelet, kube-scheduler, kube-controller-manager (cached after the first run)"
  bash scripts/build-kube-node.sh | sed 's/^/node binary: /'
fi

echo "setup done. Put the commands on your PATH (kubectl then finds \`kubectl fracgpu\`):"
echo "  export PATH=\"$PWD/.venv/bin:\$PATH\""
