#!/usr/bin/env bash
# Regenerates the protobuf schemas the in-memory API server decodes request bodies with, from the
# k8s.io/api and k8s.io/apimachinery releases matching KUBERNETES_VERSION in e2e/kube/versions.env:
# each upstream generated.proto with its comments and blank lines left out (the license header kept).
# `./update.sh --check` fails when the checked-in copies differ from what it would write.
set -euo pipefail
cd "$(dirname "$0")"
# shellcheck source=../../kube/versions.env
. ../../kube/versions.env
export GOFLAGS=-mod=mod GOTOOLCHAIN=local
release="v0.${KUBERNETES_VERSION#v1.}"

# The groups the in-memory server serves built-in kinds of, and the apimachinery types they use.
api=(core/v1 apps/v1 autoscaling/v2 coordination/v1 events/v1 admissionregistration/v1)
apimachinery=(pkg/apis/meta/v1 pkg/runtime pkg/runtime/schema pkg/util/intstr pkg/api/resource)

module_dir() { # module_dir MODULE@VERSION -> its directory in the module cache
  go mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p'
}

strip() { # the license header, then every line that is neither a comment nor blank
  awk '
    header && /^\*\/$/ { print; header = 0; next }
    header { print; next }
    NR == 1 && /^\/\*/ { print; header = 1; next }
    /^[[:space:]]*\/\// || /^[[:space:]]*$/ { next }
    { print }
  ' "$1"
}

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
api_dir=$(module_dir "k8s.io/api@$release")
machinery_dir=$(module_dir "k8s.io/apimachinery@$release")
for p in "${api[@]}"; do
  mkdir -p "$out/k8s.io/api/$p"
  strip "$api_dir/$p/generated.proto" > "$out/k8s.io/api/$p/generated.proto"
done
for p in "${apimachinery[@]}"; do
  mkdir -p "$out/k8s.io/apimachinery/$p"
  strip "$machinery_dir/$p/generated.proto" > "$out/k8s.io/apimachinery/$p/generated.proto"
done
echo "k8s.io/api $release, k8s.io/apimachinery $release" > "$out/VERSION"

if [[ ${1:-} == --check ]]; then
  if ! diff -r "$out" . --exclude=update.sh --exclude=README.md -q; then
    echo "the protobuf schemas are stale: run $0" >&2
    exit 1
  fi
  exit 0
fi
rm -rf k8s.io VERSION
cp -r "$out/k8s.io" "$out/VERSION" .
