#!/usr/bin/env bash
# Wheels for scripts/gpu-suite.sh: the packages the suite imports that a GPU machine's
# CUDA image may lack (the kubernetes client and what it needs, the pytest plugins), at
# the versions of this checkout's .venv, built for the image's CPython 3.12 on x86-64.
# They land in .whl/ (ignored by git); gpu-suite.sh installs them there.
#   scripts/gpu-wheels.sh [PYTHON-VERSION]      default 3.12
set -euo pipefail
cd "$(dirname "$0")/.."
py=${1:-3.12}
venv=.venv/bin/python
[ -x "$venv" ] || { echo "gpu-wheels: run scripts/setup.sh first (needs .venv)" >&2; exit 1; }
names=(
  kubernetes pydantic pydantic_core annotated-types typing-inspection typing_extensions
  urllib3 python-dateutil tzdata durationpy websocket-client requests-oauthlib oauthlib
  jsonpatch jsonpointer cryptography cffi pycparser orjson grpcio protobuf
  pytest-asyncio pytest-timeout
)
pins=()
for name in "${names[@]}"; do
  version=$("$venv" -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p')
  [ -n "$version" ] || { echo "gpu-wheels: $name is not installed in .venv" >&2; exit 1; }
  pins+=("$name==$version")
done
mkdir -p .whl
platforms=()
for tag in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_27_x86_64 \
  manylinux_2_28_x86_64 manylinux_2_34_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$tag")
done
"$venv" -m pip download -q --no-deps --only-binary=:all: --python-version "$py" \
  --implementation cp "${platforms[@]}" -d .whl "${pins[@]}"
ls .whl
du -sh .whl
