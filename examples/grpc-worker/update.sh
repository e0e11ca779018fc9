#!/usr/bin/env bash
# Regenerates the Python stubs (sluice/v1/worker_pb2*.py) from proto/sluice/v1/worker.proto with
# grpcio-tools (pinned in requirements.txt). `./update.sh --check` writes nothing and fails when the
# checked-in stubs differ from what it would write.
set -euo pipefail
cd "$(dirname "$0")"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
python3 -m grpc_tools.protoc -I ../../proto --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
  sluice/v1/worker.proto
if [[ ${1:-} == --check ]]; then
  if ! diff -r "$out/sluice" sluice -q --exclude=__init__.py --exclude=__pycache__; then
    echo "the Python stubs are stale: run $0" >&2
    exit 1
  fi
  exit 0
fi
mkdir -p sluice/v1
cp "$out"/sluice/v1/worker_pb2*.py* sluice/v1/
