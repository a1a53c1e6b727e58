#!/usr/bin/env bash
# Install the Debian packages fracgpu's tests and builds need on a fresh bookworm machine.
# Idempotent: when every package is already installed it touches nothing (no apt-get update),
# so reruns in CI cost well under a second. Must run as root (or through sudo).
set -euo pipefail

# etcd-server: the real etcd (3.4) used by the end-to-end suite.
# golang-go, rsync, jq, dpkg-dev, build-essential: build kube-apiserver, kubelet,
# kube-scheduler and kube-controller-manager from Debian's `kubernetes` source package
# (scripts/build-kube-components.sh).
# ca-certificates, openssl: TLS tooling used around the control plane.
PACKAGES=(
  etcd-server
  golang-github-modern-go-reflect2-dev
  golang-go
  rsync
  jq
  dpkg-dev
  build-essential
  ca-certificates
  openssl
  # the chart tests' renderer (tests/chart/render): Go templates with Sprig, as helm has
  golang-github-masterminds-sprig-dev
  golang-gopkg-yaml.v2-dev
  # promtool, which runs the chart's alert rules against scraped series
  # (tests/chart/test_alerts_promtool.py); nothing else of the package is used
  prometheus
  # libFuzzer + ASan/UBSan for the shim's limits-parser fuzzer (make -C shim fuzz,
  # tests/shim/test_fuzz.py); the runtime libraries are only a Recommends of clang-14
  clang
  libclang-rt-14-dev
  # the node tier (tests/node): a container runtime, its CNI plugins, a static busybox for
  # the test image, and ip/nsenter for the tier's network namespace
  containerd
  runc
  containernetworking-plugins
  busybox-static
  iproute2
  util-linux
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  if [[ "$status" != "install ok installed" ]]; then
    missing+=("$pkg")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-system-deps: all ${#PACKAGES[@]} packages already installed"
  exit 0
fi

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo)
  else
    echo "install-system-deps: missing ${missing[*]} and not root (no sudo either)" >&2
    exit 1
  fi
fi

echo "install-system-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -q
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
  "${missing[@]}"

# The Debian etcd-server package starts a system etcd on 2379/2380; the tests run their own
# etcd on random ports and do not need it. Leave it alone unless it is running and would
# compete for the machine's two cores: stop it only if systemd manages it.
# The same for the Debian prometheus package's own server (the tests only need promtool) and
# the containerd package's system service (the node tier runs its own containerd with
# private state inside a network namespace).
for service in etcd prometheus containerd; do
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet "$service" 2>/dev/null; then
    "${SUDO[@]}" systemctl stop "$service" || true
    "${SUDO[@]}" systemctl disable "$service" || true
  fi
done
echo "install-system-deps: done"
