#!/usr/bin/env bash
# Builds (or reuses) the operator binary of an earlier commit of this repository, which the
# upgrade test (`tests/e2e_operator_upgrade.rs`) starts a cluster under before replacing it
# with this build. Prints the binary's path.
#
#   ~/.cache/valkey-operator/operator/<commit>/valkey-operator
#
# The commit's tree comes from this repository's history (`git archive`), so a shallow clone
# that lacks it fails with git's message. A debug build, about 5 minutes on 2 cores, once per
# commit, in its own target directory, deleted after.
set -euo pipefail

commit="${1:?usage: build-previous-operator.sh <commit>}"

cache_root="${VALKEY_OPERATOR_CACHE:-$HOME/.cache/valkey-operator}/operator"
root="$cache_root/$commit"
binary="$root/valkey-operator"

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

echo "build-previous-operator.sh: building the operator of $commit into $root (once)" >&2
source_dir=$(mktemp -d)
trap 'rm -rf "$source_dir"' EXIT
git -C "$(dirname "$0")/.." archive "$commit" | tar -x -C "$source_dir"
CARGO_TARGET_DIR="$source_dir/target" cargo build --quiet --locked \
	--manifest-path "$source_dir/Cargo.toml" --bin valkey-operator >&2
cp "$source_dir/target/debug/valkey-operator" "$binary.partial"
mv "$binary.partial" "$binary"
echo "$binary"
