# Sluice's two commands: `make sandbox` runs it locally, `make test` runs every test.
# (Other targets are steps of those two.)
.PHONY: sandbox test deps lint unit fuzz-smoke fuzz chart crds e2e-tools e2e-real images image-test

CARGO ?= cargo
NEXTEST_PROFILE ?= default

# The container images `make images` builds (local storage; push them with `podman push`).
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
IMAGE_REPO ?= localhost
IMAGE_TAG ?= $(VERSION)
OPERATOR_IMAGE ?= $(IMAGE_REPO)/sluice-operator:$(IMAGE_TAG)
SIDECAR_IMAGE ?= $(IMAGE_REPO)/sluice-sidecar:$(IMAGE_TAG)

## Run Sluice locally: the real operator and sidecars on an in-memory API server with throwaway Redis and
## PostgreSQL, a live demo of both CRDs; Ctrl-C stops everything (docs/sandbox.md). SANDBOX_ARGS=--duration 60
sandbox:
	$(CARGO) build -p sluice-operator -p sluice-sidecar -p sluice-e2e --bins
	$(CARGO) run -q -p sluice-e2e --bin sluice-sandbox -- $(SANDBOX_ARGS)

## Run every test: installs/builds what the tests need, then formatting, lints and all test suites,
## the whole system on a real Kubernetes control plane included, and the container images built and run
## (built before the test suites: the rate-limit scenario runs them with Podman).
test: export SLUICE_E2E_OPERATOR_IMAGE = $(OPERATOR_IMAGE)
test: export SLUICE_E2E_SIDECAR_IMAGE = $(SIDECAR_IMAGE)
test: deps e2e-tools lint images unit fuzz-smoke e2e-real chart image-test

deps:
	./.ci/deps.sh

## Build (or find, when built) the pinned kube-apiserver, kube-controller-manager, kubectl, etcd and helm
## from Go modules into ~/.cache/sluice (e2e/kube/build.sh; 10-20 minutes cold, a second when built).
e2e-tools:
	./e2e/kube/build.sh

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) fmt --manifest-path fuzz/Cargo.toml -- --check
	@# fuzz/ is a workspace of its own: its lock file must take the crates' new dependencies too.
	$(CARGO) metadata --locked --manifest-path fuzz/Cargo.toml --format-version 1 > /dev/null
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings
	./e2e/apiserver/proto/update.sh --check
	./proto/update.sh --check && ./examples/grpc-worker/update.sh --check

unit:
	$(CARGO) nextest run --workspace --locked --profile $(NEXTEST_PROFILE) -E 'not binary(real_control_plane)'
	$(CARGO) test --workspace --locked --doc

## Fuzz each parser of untrusted input (the HTTP/1.1 request head, the chunked coding, the sidecar config,
## the pod annotations) for a fixed number of runs from a fixed seed, about 10 s each (fuzz/README.md).
fuzz-smoke:
	./fuzz/run.sh smoke

## Fuzz for longer: FUZZ_SECONDS per target (default 600), FUZZ_TARGETS to choose (default all four).
FUZZ_SECONDS ?= 600
fuzz:
	FUZZ_SECONDS=$(FUZZ_SECONDS) ./fuzz/run.sh long $(FUZZ_TARGETS)

## Sluice on a real control plane (etcd, kube-apiserver, kube-controller-manager; real helm): prints the
## versions, then each whole-system scenario's result (e2e/README.md). Built for the whole workspace, as
## `unit` builds, so the dependencies compiled there are reused rather than compiled again with other features.
e2e-real: e2e-tools
	$(CARGO) build --locked --workspace --bins
	$(CARGO) nextest run --workspace --locked --profile $(NEXTEST_PROFILE) -E 'binary(real_control_plane)' --no-capture

chart:
	python3 charts/test_chart.py

## Regenerate the CRD YAML from the Rust types (crds/ and the chart's copy; tests fail when either is stale).
crds:
	$(CARGO) run -q -p sluice-operator -- crdgen --dir crds
	cp crds/*.yaml charts/sluice/crds/

## Build the sluice-operator and sluice-sidecar images with Podman, no registry needed: release binaries,
## a runtime base assembled from Debian packages, the Dockerfile, an SBOM per image (target/images/sbom/).
## IMAGE_REPO=ghcr.io/you IMAGE_TAG=0.1.0 names them for a push.
images:
	nice -n 10 $(CARGO) build --release --locked -p sluice-operator -p sluice-sidecar
	OPERATOR_IMAGE=$(OPERATOR_IMAGE) SIDECAR_IMAGE=$(SIDECAR_IMAGE) ./images/build.sh

## Run both images as the chart does (UID 65532, read-only root, no capabilities): --version, --help,
## crdgen, probe, and the sidecar limiting requests with a throwaway Redis.
image-test: images
	OPERATOR_IMAGE=$(OPERATOR_IMAGE) SIDECAR_IMAGE=$(SIDECAR_IMAGE) python3 images/test_images.py
