#!/usr/bin/env bash
# Builds (or reuses) kube-router, the network plugin whose firewall enforces NetworkPolicies on
# the real test nodes (iptables and ipset, the way platform teams run it in production with
# `--run-firewall`), from its source on the Go module proxy. The real nodes keep the CNI
# reference plugins for addresses and routes; kube-router runs beside them with its router and
# service proxy off (tests/testenv/src/node/firewall.rs). Needs `ipset`, which
# hack/install-node-packages.sh installs. Prints the binary's path.
#
#   ~/.cache/valkey-operator/kube-router/<version>/kube-router
#
# v2.1.0: the one version whose source the module proxy here serves (it lists v2.11.1 but
# refuses its archive). The advisories against v2.1.0 (fixed in v2.1.3) concern the service
# proxy's external IPs and the BGP router, both of which run switched off here; it is a test
# node's firewall, never shipped with the operator.
set -euo pipefail

KUBE_ROUTER_VERSION=v2.1.0

root="${VALKEY_OPERATOR_CACHE:-$HOME/.cache/valkey-operator}/kube-router/$KUBE_ROUTER_VERSION"
binary="$root/kube-router"

if [[ ! -x "$binary" ]]; then
	mkdir -p "$root"
	# One build at a time: a second caller waits, then finds the binary.
	exec 9>"$root/.lock"
	flock 9
	if [[ ! -x "$binary" ]]; then
		echo "build-kube-router.sh: building kube-router $KUBE_ROUTER_VERSION into $root (once)" >&2
		# Static, as upstream builds it; the version stamp is what `kube-router --version` prints.
		CGO_ENABLED=0 GOBIN="$root" go install \
			-ldflags "-s -w -X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=$KUBE_ROUTER_VERSION" \
			"github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@$KUBE_ROUTER_VERSION" >&2
	fi
fi
echo "$binary"
