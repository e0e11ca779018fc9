#!/usr/bin/env bash
# Builds (or finds, when already built) the pinned kube-apiserver, kube-controller-manager, kubectl, etcd and
# helm from Go modules into a cache outside the repository, and prints the directory of each:
#
#   kubernetes=/root/.cache/sluice/kubernetes-v1.37.2
#   etcd=/root/.cache/sluice/etcd-v3.6.16
#   helm=/root/.cache/sluice/helm-v4.3.1
#
# Cache: $SLUICE_TOOLS_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/sluice; one directory per tool and version,
# with a stamp of the wrapper module (go.mod, go.sum, flags) it was built from, so a changed wrapper rebuilds.
# A cold build takes 10-20 minutes on 2 cores (and ~4 GB of Go caches); a warm one checks stamps and exits.
# Needs Go (go.mod's version or newer) and the Go module proxy; says so and exits 2 when either is missing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"
cache=${SLUICE_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice}
quiet=false
[ "${1-}" = "--quiet" ] && quiet=true
say() { $quiet || echo "build.sh: $*" >&2; }
fail() { echo "build.sh: $*" >&2; exit 2; }

go=$(command -v go || true)
[ -z "$go" ] && [ -x /usr/local/go/bin/go ] && go=/usr/local/go/bin/go
[ -n "$go" ] || fail "Go is not installed (needs Go $(sed -n 's/^go //p' "$here/kubernetes/go.mod") or newer from https://go.dev/dl/, or set SLUICE_E2E_KUBECONFIG to run against an existing cluster)"
export GOTOOLCHAIN=local GOFLAGS="-mod=readonly -trimpath -buildvcs=false" CGO_ENABLED=0
need_go=$(sed -n 's/^go //p' "$here/kubernetes/go.mod")
have_go=$("$go" env GOVERSION | sed 's/^go//')
if [ "$(printf '%s\n%s\n' "$need_go" "$have_go" | sort -V | head -1)" != "$need_go" ]; then
  fail "Go $have_go is too old: Kubernetes $KUBERNETES_VERSION needs Go $need_go or newer"
fi

mkdir -p "$cache"
exec 9>"$cache/.build.lock"
if ! flock -n 9; then
  say "another build.sh is building into $cache; waiting for it"
  flock 9
fi

# build NAME WRAPPER_DIR "LDFLAGS" PACKAGE... : go build the packages into $cache/NAME unless its stamp matches.
build() {
  local name=$1 tool=$2 wrapper=$here/$2 ldflags=$3
  shift 3
  local dir=$cache/$name
  local stamp
  stamp=$(cat "$wrapper/go.mod" "$wrapper/go.sum" <(echo "$ldflags $GOFLAGS $have_go") | sha256sum | cut -d' ' -f1)
  if [ -f "$dir/.stamp" ] && [ "$(cat "$dir/.stamp")" = "$stamp" ]; then
    echo "$tool=$dir"
    return
  fi
  say "building $name with Go $have_go (a cold build takes minutes; later runs reuse $dir)"
  local started=$SECONDS
  if ! (cd "$wrapper" && timeout 900 "$go" mod download >/dev/null 2>"$cache/.download.err"); then
    cat "$cache/.download.err" >&2
    fail "could not download the Go modules for $name (GOPROXY=$("$go" env GOPROXY)); the real control plane is built from the Go module proxy"
  fi
  rm -rf "$dir.tmp"
  mkdir -p "$dir.tmp"
  # The release date (a build.sh placeholder) comes from the module proxy, only when building.
  if [[ $ldflags == *@RELEASE_DATE@* ]]; then
    local date
    date=$(cd "$wrapper" && "$go" mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" | sed -n 's/^[[:space:]]*"Time": "\(.*\)",\{0,1\}$/\1/p')
    ldflags=${ldflags//@RELEASE_DATE@/${date:-1970-01-01T00:00:00Z}}
  fi
  (cd "$wrapper" && nice -n 10 "$go" build -ldflags "$ldflags" -o "$dir.tmp/" "$@")
  echo "$stamp" >"$dir.tmp/.stamp"
  rm -rf "$dir"
  mv "$dir.tmp" "$dir"
  say "built $name in $((SECONDS - started)) s"
  echo "$tool=$dir"
}

# Version fields as Kubernetes' own build sets them (hack/lib/version.sh); without them the servers say
# v0.0.0-master and kubectl refuses to talk to them. The build date is the release's, from the module proxy.
kube_minor=${KUBERNETES_VERSION#v1.}
kube_minor=${kube_minor%%.*}
kube_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kube_ldflags+=" -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$kube_minor"
  kube_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=@RELEASE_DATE@"
done
build "kubernetes-$KUBERNETES_VERSION" kubernetes "$kube_ldflags" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubectl

# etcd's version is a constant in its api module, so it needs no version flags.
build "etcd-$ETCD_VERSION" etcd "-s -w" .

helm_major=${HELM_VERSION%%.*}
build "helm-$HELM_VERSION" helm "-s -w -X helm.sh/helm/$helm_major/internal/version.version=$HELM_VERSION -X helm.sh/helm/$helm_major/internal/version.metadata= -X helm.sh/helm/$helm_major/internal/version.gitTreeState=clean" \
  "helm.sh/helm/$helm_major/cmd/helm"
