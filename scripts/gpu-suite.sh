#!/usr/bin/env bash
# The checks that need a real NVIDIA GPU, in one run: the shim's GPU suite (PyTorch), every
# allocation path through mem_ops, a program built with nvcc (static cudart), CUDA clients
# written by others (numba-cuda, cuda-core, cuda-bindings, pynvml, CuPy, JAX) and the agent
# on the real driver. Run from the repository root on a machine with the
# driver and a CUDA-enabled PyTorch as python3. Wheels in .whl/ (the project's
# dependencies that machine lacks; scripts/gpu-wheels.sh fetches them on a machine with
# the package registries) are installed into that Python first.
#   scripts/gpu-suite.sh [OUTDIR [PYTEST-ARGS...]]   results: OUTDIR/{machine.txt,pytest.log,junit.xml}
# PYTEST-ARGS narrow the run, e.g. -k share.
set -uo pipefail
out=${1:-${OUT:-/tmp/fracgpu-gpu-suite}}
shift $(($# > 0 ? 1 : 0))
budget=${FRACGPU_GPU_SUITE_SECONDS:-330}
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-cache-dir .whl/*.whl 2>&1 | tail -5
fi
{
  nvidia-smi
  nvidia-smi --query-gpu=name,uuid,memory.total,driver_version --format=csv
  python3 -c 'import sys, torch; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda)'
  uname -a
} >"$out/machine.txt" 2>&1
cat "$out/machine.txt"
# Without a compiler, use the build that travelled with the tree (made newer than its sources).
if ! command -v cc >/dev/null; then
  echo "no cc: using the carried shim/build"
  find shim/build -type f -exec touch {} +
fi
make -s -C shim || exit 1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
timeout "$budget" python3 -m pytest -p pytest_asyncio.plugin -p pytest_timeout -p no:cacheprovider \
  -m gpu tests/gpu/test_memory_gpu.py tests/gpu/test_clients_gpu.py tests/gpu/test_shim_gpu.py tests/agent/test_real_gpu.py \
  -v -s -rA --timeout 200 --durations 0 --junitxml "$out/junit.xml" "$@" 2>&1 | tee "$out/pytest.log"
