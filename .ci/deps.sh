#!/usr/bin/env bash
# Installs what Sluice's tests need when it is missing, or stops naming what is missing.
# The tests start their own redis-server and PostgreSQL processes (never the machine's own servers), drive
# the real kubectl, and run under cargo-nextest. The images are built and run with Podman (runc as its
# runtime); their SBOMs are written by cargo-cyclonedx. The fuzz targets are built by cargo-fuzz (libFuzzer,
# compiled with g++). As root, missing Debian packages are installed with apt-get; otherwise this script
# says which package to install and exits non-zero.
set -euo pipefail

missing=()
need() { # need COMMAND PACKAGE
  command -v "$1" >/dev/null 2>&1 || missing+=("$2")
}
need redis-server redis-server
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1 || missing+=(postgresql)
need psql postgresql-client
need kubectl kubectl
need setpriv util-linux
need pgrep procps
need podman podman
need runc runc
need buildah buildah
need c++ g++ # libFuzzer (the fuzz targets) is C++

if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "deps: installing ${missing[*]} with apt-get"
    apt-get update -qq
    # kubectl is not in Debian's own archive; it installs where a Kubernetes/Google apt source is configured.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" || {
      echo "deps: apt-get could not install: ${missing[*]}" >&2
      echo "deps: install them by hand (kubectl 1.32+: https://kubernetes.io/docs/tasks/tools/)" >&2
      exit 1
    }
  else
    echo "deps: missing ${missing[*]}; install them (as root: apt-get install ${missing[*]})" >&2
    exit 1
  fi
fi

if ! cargo nextest --version >/dev/null 2>&1; then
  echo "deps: installing cargo-nextest from crates.io (takes a few minutes)"
  cargo install --locked cargo-nextest
fi

# One SBOM per image (make images); pinned so the SBOMs' format does not drift.
CYCLONEDX_VERSION=0.5.9
if [ "$(cargo cyclonedx --version 2>/dev/null | awk '{print $2}')" != "$CYCLONEDX_VERSION" ]; then
  echo "deps: installing cargo-cyclonedx $CYCLONEDX_VERSION from crates.io"
  cargo install --locked --quiet cargo-cyclonedx --version "$CYCLONEDX_VERSION"
fi

# The fuzz targets (make fuzz-smoke); pinned so the build flags it passes do not drift.
CARGO_FUZZ_VERSION=0.13.2
if [ "$(cargo fuzz --version 2>/dev/null | awk '{print $2}')" != "$CARGO_FUZZ_VERSION" ]; then
  echo "deps: installing cargo-fuzz $CARGO_FUZZ_VERSION from crates.io"
  cargo install --locked --quiet cargo-fuzz --version "$CARGO_FUZZ_VERSION"
fi

# The chart is checked with the real Helm SDK and the Kubernetes schemas (charts/test_chart.py).
if ! python3 -c "import helm_python, kubernetes_validate, yaml" >/dev/null 2>&1; then
  echo "deps: installing helm-python-sdk, kubernetes-validate and PyYAML from PyPI"
  python3 -m pip install --quiet --disable-pip-version-check \
    "helm-python-sdk==0.2.2" "kubernetes-validate==1.37.0" "PyYAML>=6" || {
    echo "deps: pip could not install helm-python-sdk/kubernetes-validate (needed by charts/test_chart.py)" >&2
    exit 1
  }
fi

# The gRPC example worker (examples/grpc-worker: its test and its stubs' check); pinned like its requirements.txt.
if ! python3 -c "import grpc, grpc_tools" >/dev/null 2>&1; then
  echo "deps: installing grpcio, grpcio-tools and protobuf from PyPI"
  python3 -m pip install --quiet --disable-pip-version-check -r "$(dirname "$0")/../examples/grpc-worker/requirements.txt" || {
    echo "deps: pip could not install examples/grpc-worker/requirements.txt" >&2
    exit 1
  }
fi

# The machine's own PostgreSQL refuses to run as root; the tests run it as this user.
if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
  echo "deps: running as root but there is no 'postgres' user to run PostgreSQL as" >&2
  exit 1
fi
echo "deps: ok (redis-server $(redis-server --version | sed -E 's/.*v=([^ ]+).*/\1/'), kubectl $(kubectl version --client -o json 2>/dev/null | sed -n 's/.*"gitVersion": "\(.*\)".*/\1/p' | head -1))"
