#!/usr/bin/env bash
# Builds (or reuses) the real prometheus and promtool the metrics tests run, from the Go module
# under tests/tools/prometheus. Prints the bin directory on stdout.
#
# The cache key is a hash of the module files, so editing go.mod/go.sum builds into a fresh
# directory and an unchanged module is never rebuilt:
#   ~/.cache/valkey-operator/prometheus/<key>/bin/
# The web UI's assets are not embedded (no `builtinassets` tag): the tests use the HTTP API only.
set -euo pipefail

PROMETHEUS_VERSION=3.16.0 # module v0.316.0

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tools_dir="$repo_root/tests/tools/prometheus"
cache_root="${VALKEY_OPERATOR_CACHE:-$HOME/.cache/valkey-operator}/prometheus"
binaries=(prometheus promtool)

key=$(cd "$tools_dir" && cat go.mod go.sum tools.go | sha256sum | cut -c1-16)
bin_dir="$cache_root/$key/bin"

all_present() {
	local b
	for b in "${binaries[@]}"; do [[ -x "$bin_dir/$b" ]] || return 1; done
}

if all_present; then
	echo "$bin_dir"
	exit 0
fi

command -v go >/dev/null || { echo "build-prometheus.sh: 'go' is not on PATH; install Go >= 1.26" >&2; exit 1; }

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

ldflags="-s -w -X github.com/prometheus/common/version.Version=$PROMETHEUS_VERSION"
echo "build-prometheus.sh: building prometheus and promtool $PROMETHEUS_VERSION (~5 min on 2 cores)" >&2
(cd "$tools_dir" && go build -trimpath -ldflags "$ldflags" -o "$staging/" \
	github.com/prometheus/prometheus/cmd/prometheus \
	github.com/prometheus/prometheus/cmd/promtool)

rm -rf "$bin_dir"
mv "$staging" "$bin_dir"
echo "build-prometheus.sh: built in $(($(date +%s) - started))s" >&2
echo "$bin_dir"
