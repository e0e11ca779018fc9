#!/usr/bin/env bash
# Regenerates the sidecar's Rust code for the gRPC API from proto/sluice/v1/*.proto (protox and
# tonic-prost-build, no protoc), into sidecar/src/queue/grpc/generated/.
# `./update.sh --check` writes nothing and fails when the checked-in code is stale (`make lint` runs it).
set -euo pipefail
cd "$(dirname "$0")"
root=$(cd .. && pwd)
# Built in the workspace's target directory (ignored by git), apart from the workspace's own builds.
exec "${CARGO:-cargo}" run --quiet --locked --manifest-path gen/Cargo.toml --target-dir "$root/target/proto-gen" -- "$@" "$root"
