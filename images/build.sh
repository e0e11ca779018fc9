#!/usr/bin/env bash
# Builds Sluice's two images with Podman from the repository's Dockerfile, without a container registry:
# the runtime base is assembled from Debian packages (images/assemble-base.sh) and the binaries are the
# ones cargo built on this host (`--build-arg BINARIES=prebuilt`). Then writes an SBOM per image.
# `make images` runs it after `cargo build --release`.
#
# Environment (the Makefile sets them): OPERATOR_IMAGE, SIDECAR_IMAGE (tags to build), RUNTIME_BASE (tag
# of the local base), BIN_DIR (the release binaries, default target/release), IMAGES_OUT (work and
# output directory, default target/images), CONTAINERS_CONF (default images/containers.conf).
set -euo pipefail
cd "$(dirname "$0")/.."

: "${OPERATOR_IMAGE:?OPERATOR_IMAGE names the operator image to build}"
: "${SIDECAR_IMAGE:?SIDECAR_IMAGE names the sidecar image to build}"
. /etc/os-release
RUNTIME_BASE=${RUNTIME_BASE:-localhost/sluice-runtime-base:${ID}${VERSION_ID:-}}
BIN_DIR=${BIN_DIR:-target/release}
IMAGES_OUT=${IMAGES_OUT:-target/images}
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/images/containers.conf}

for bin in sluice-operator sluice-sidecar; do
  if [ ! -x "$BIN_DIR/$bin" ]; then
    echo "images: $BIN_DIR/$bin is missing; build it with: cargo build --release -p $bin" >&2
    exit 1
  fi
done

start=$(date +%s)
images/assemble-base.sh "$IMAGES_OUT" "$RUNTIME_BASE"
base_done=$(date +%s)

# The build context holds the two binaries and nothing else, stripped as the Dockerfile's compile stage
# strips them (the release profile keeps line tables: a binary four times the size). The unstripped
# binaries stay in $BIN_DIR to symbolize a backtrace.
context="$IMAGES_OUT/context"
rm -rf "$context"
mkdir -p "$context"
for bin in sluice-operator sluice-sidecar; do
  strip --strip-all -o "$context/$bin" "$BIN_DIR/$bin"
done

build() { # build TARGET IMAGE
  podman build --quiet --pull=never \
    --build-arg "RUNTIME_BASE=$RUNTIME_BASE" --build-arg BINARIES=prebuilt \
    --target "$1" --tag "$2" --file Dockerfile "$context" >/dev/null
}
build operator "$OPERATOR_IMAGE"
build sidecar "$SIDECAR_IMAGE"
# Untagged images earlier builds of other binaries left (the stage holding both binaries, the steps of
# each image), found by the labels the Dockerfile sets; other images in the storage are left alone.
for label in dev.sluice.stage=prebuilt-binaries org.opencontainers.image.title=sluice-operator \
  org.opencontainers.image.title=sluice-sidecar; do
  podman image prune --force --filter "label=$label" >/dev/null
done
images_done=$(date +%s)

# SBOMs: cargo-cyclonedx describes each binary's crates (it writes `<bin>_bin.cdx.json` beside every
# workspace member's Cargo.toml; they are moved out of the source tree at once). SOURCE_DATE_EPOCH (the
# last commit's time) makes that part reproducible: no random serial number, a fixed timestamp.
if ! cargo cyclonedx --version >/dev/null 2>&1; then
  echo "images: cargo-cyclonedx is missing (make deps installs it)" >&2
  exit 1
fi
mkdir -p "$IMAGES_OUT/sbom/crates"
cleanup_boms() { find . -path ./target -prune -o -name '*_bin.cdx.json' -print0 | xargs -0 rm -f; }
trap cleanup_boms EXIT
SOURCE_DATE_EPOCH=$(git log -1 --format=%ct 2>/dev/null || echo 0) \
  cargo cyclonedx --quiet --format json --spec-version 1.5 --describe binaries
mv operator/sluice-operator_bin.cdx.json sidecar/sluice-sidecar_bin.cdx.json "$IMAGES_OUT/sbom/crates/"
cleanup_boms
for pair in "sluice-operator=$OPERATOR_IMAGE" "sluice-sidecar=$SIDECAR_IMAGE"; do
  bin=${pair%%=*}
  image=${pair#*=}
  python3 images/sbom.py --crates "$IMAGES_OUT/sbom/crates/${bin}_bin.cdx.json" --workspace "$PWD" \
    --image "$image" --rootfs "$IMAGES_OUT/rootfs" --out "$IMAGES_OUT/sbom/$bin.cdx.json"
done
sbom_done=$(date +%s)

for image in "$OPERATOR_IMAGE" "$SIDECAR_IMAGE"; do
  size=$(podman image inspect --format '{{.Size}}' "$image")
  echo "images: $image $(awk "BEGIN { printf \"%.1f\", $size / 1000000 }") MB"
done
echo "images: SBOMs in $IMAGES_OUT/sbom/ (CycloneDX JSON)"
echo "images: took $((base_done - start)) s for the base, $((images_done - base_done)) s for the images," \
  "$((sbom_done - images_done)) s for the SBOMs"
