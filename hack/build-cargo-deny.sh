#!/usr/bin/env bash
# Builds (or reuses) cargo-deny, which `make lint` runs over the dependency graph (deny.toml),
# from its source on the crates registry, with its own lock file. Prints the binary's path.
#
#   ~/.cache/valkey-operator/cargo-deny/<version>/bin/cargo-deny
#
# About 8 minutes on 2 cores, once per version; the build uses its own target directory, deleted
# after, so it never touches the workspace's.
set -euo pipefail

CARGO_DENY_VERSION=0.20.2

cache_root="${VALKEY_OPERATOR_CACHE:-$HOME/.cache/valkey-operator}/cargo-deny"
root="$cache_root/$CARGO_DENY_VERSION"
binary="$root/bin/cargo-deny"

if [[ -x "$binary" ]]; then
	echo "$binary"
	exit 0
fi

mkdir -p "$root"
# One build at a time: a second caller waits, then finds the binary.
exec 9>"$root/.lock"
flock 9
if [[ -x "$binary" ]]; then
	echo "$binary"
	exit 0
fi

echo "build-cargo-deny.sh: building cargo-deny $CARGO_DENY_VERSION into $root (once)" >&2
build_dir=$(mktemp -d)
trap 'rm -rf "$build_dir"' EXIT
CARGO_TARGET_DIR="$build_dir" cargo install --quiet --locked --root "$root" \
	--version "$CARGO_DENY_VERSION" cargo-deny >&2
echo "$binary"
