#!/usr/bin/env bash
# Builds (or reuses) crictl, the CRI client a Kubernetes node's operator uses to see the
# containers its kubelet runs (`crictl ps`), from cri-tools' source on the Go module proxy
# (Debian 12 packages no cri-tools). `make dev` uses it on real nodes; the tests do not need it.
# Prints the binary's path.
#
#   ~/.cache/valkey-operator/crictl/<version>/crictl
set -euo pipefail

CRICTL_VERSION=v1.34.0

root="${VALKEY_OPERATOR_CACHE:-$HOME/.cache/valkey-operator}/crictl/$CRICTL_VERSION"
binary="$root/crictl"

if [[ ! -x "$binary" ]]; then
	mkdir -p "$root"
	# One build at a time: a second caller waits, then finds the binary.
	exec 9>"$root/.lock"
	flock 9
	if [[ ! -x "$binary" ]]; then
		echo "build-crictl.sh: building crictl $CRICTL_VERSION into $root (once)" >&2
		GOBIN="$root" go install "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION" >&2
	fi
fi
echo "$binary"
