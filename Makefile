# Sluice's two commands: `make sandbox` runs it locally, `make test` runs every test.
# (Other targets are steps of those two.)
.PHONY: sandbox test deps lint unit chart crds

CARGO ?= cargo
NEXTEST_PROFILE ?= default

## Run Sluice locally: the real operator and sidecars on an in-memory API server with throwaway Redis and
## PostgreSQL, a live demo of both CRDs; Ctrl-C stops everything (docs/sandbox.md). SANDBOX_ARGS=--duration 60
sandbox:
	$(CARGO) build -p sluice-operator -p sluice-sidecar -p sluice-e2e --bins
	$(CARGO) run -q -p sluice-e2e --bin sluice-sandbox -- $(SANDBOX_ARGS)

## Run every test: installs/starts what the tests need, then formatting, lints and all test suites.
test: deps lint unit chart

deps:
	./.ci/deps.sh

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

unit:
	$(CARGO) nextest run --workspace --locked --profile $(NEXTEST_PROFILE)
	$(CARGO) test --workspace --locked --doc

chart:
	python3 charts/test_chart.py

## Regenerate the CRD YAML from the Rust types (crds/ and the chart's copy; tests fail when either is stale).
crds:
	$(CARGO) run -q -p sluice-operator -- crdgen --dir crds
	cp crds/*.yaml charts/sluice/crds/
