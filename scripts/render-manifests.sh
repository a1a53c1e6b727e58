#!/usr/bin/env bash
# Render charts/fracgpu into deploy/manifests/ (plain manifests for `kubectl apply` without
# Helm; docs/install-without-helm.md). `--check` only compares and exits 1 on a difference.
# Needs the setup's virtual environment and the chart renderer's Go packages
# (scripts/install-system-deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
exec env PYTHONPATH=. .venv/bin/python -m tests.chart.manifests "$@"
