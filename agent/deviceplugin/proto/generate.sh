#!/bin/sh
# Regenerates the committed Python gRPC stubs from the .proto files in this directory.
# Run from the repository root: sh agent/deviceplugin/proto/generate.sh
set -eu
PYTHON=${PYTHON:-.venv/bin/python}
cd "$(dirname "$0")/../../.."
for proto in agent/deviceplugin/proto/*.proto; do
    "$PYTHON" -m grpc_tools.protoc -I . --python_out=. --pyi_out=. --grpc_python_out=. "$proto"
done
# The generated modules are not ours to type-check; keep mypy --strict from following into them.
# (The *_pb2_grpc.pyi stubs are hand-written so that callers stay fully typed.)
for generated in agent/deviceplugin/proto/*_pb2.py agent/deviceplugin/proto/*_pb2_grpc.py \
    agent/deviceplugin/proto/*_pb2.pyi; do
    if ! head -n 1 "$generated" | grep -q 'mypy: ignore-errors'; then
        { echo '# mypy: ignore-errors'; cat "$generated"; } > "$generated.tmp"
        mv "$generated.tmp" "$generated"
    fi
done
