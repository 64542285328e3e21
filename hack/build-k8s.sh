#!/usr/bin/env bash
# Builds (or reuses) the real control-plane binaries the tests and `make dev` run:
# etcd, kube-apiserver, kube-controller-manager, kubectl and helm, from the Go
# modules under tests/tools/, and the node's kube-scheduler and kubelet from the same
# Kubernetes module (the real test nodes, tests/testenv/src/node/). Prints the bin
# directory on stdout.
#
# The cache key is a hash of the module files, so editing a go.mod/go.sum builds
# into a fresh directory and an unchanged module is never rebuilt:
#   ~/.cache/valkey-operator/k8s/<key>/bin/
set -euo pipefail

K8S_VERSION=v1.35.4
HELM_VERSION=v3.22.0

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tools_dir="$repo_root/tests/tools"
cache_root="${VALKEY_OPERATOR_CACHE:-$HOME/.cache/valkey-operator}/k8s"
binaries=(etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl helm)

key=$(cd "$tools_dir" && cat k8s/go.mod k8s/go.sum k8s/tools.go etcd/go.mod etcd/go.sum etcd/tools.go \
	helm/go.mod helm/go.sum helm/tools.go | sha256sum | cut -c1-16)
bin_dir="$cache_root/$key/bin"

all_present() {
	local b
	for b in "${binaries[@]}"; do [[ -x "$bin_dir/$b" ]] || return 1; done
}

if all_present; then
	echo "$bin_dir"
	exit 0
fi

command -v go >/dev/null || { echo "build-k8s.sh: 'go' is not on PATH; install Go >= 1.26" >&2; exit 1; }

mkdir -p "$cache_root/$key"
# One build at a time per key: a second caller waits, then finds the binaries.
exec 9>"$cache_root/$key/.lock"
flock 9
if all_present; then
	echo "$bin_dir"
	exit 0
fi

export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0
staging="$cache_root/$key/bin.partial"
rm -rf "$staging"
mkdir -p "$staging"
started=$(date +%s)

# The same version stamps Kubernetes' own build sets (hack/lib/version.sh), so that
# /version and `kubectl version` report the real release.
k8s_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	k8s_ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=35"
	k8s_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

echo "build-k8s.sh: building etcd into $bin_dir" >&2
(cd "$tools_dir/etcd" && go build -trimpath -ldflags "-s -w" -o "$staging/etcd" go.etcd.io/etcd/server/v3)

echo "build-k8s.sh: building kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl $K8S_VERSION (slow: ~25 min on 2 cores)" >&2
(cd "$tools_dir/k8s" && go build -trimpath -ldflags "$k8s_ldflags" -o "$staging/" \
	k8s.io/kubernetes/cmd/kube-apiserver \
	k8s.io/kubernetes/cmd/kube-controller-manager \
	k8s.io/kubernetes/cmd/kube-scheduler \
	k8s.io/kubernetes/cmd/kubelet \
	k8s.io/kubernetes/cmd/kubectl)

echo "build-k8s.sh: building helm $HELM_VERSION" >&2
(cd "$tools_dir/helm" && go build -trimpath \
	-ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
	-o "$staging/helm" helm.sh/helm/v3/cmd/helm)

rm -rf "$bin_dir"
mv "$staging" "$bin_dir"
echo "build-k8s.sh: built in $(($(date +%s) - started))s" >&2
echo "$bin_dir"
