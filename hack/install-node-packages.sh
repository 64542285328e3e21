#!/usr/bin/env bash
# Installs what a real test node runs beside the kubelet: containerd, runc and the CNI
# reference plugins (bridge, host-local, loopback), from Debian's packages; iptables and ipset,
# which the network plugin's firewall programs (hack/build-kube-router.sh); and redis-tools,
# whose `redis-cli` the test Valkey images carry as `valkey-cli` (the official images have
# valkey-cli, which the Pods' liveness probe runs; no valkey-cli build is reachable from the
# test machines, and the probe's flags, `-s SOCKET PING`, and its exit codes are the same).
#
# Debian's packages rather than the Go modules: they are built and patched by the
# distribution for this kernel and libc (runc links libseccomp), install in a minute instead
# of a build of several, and are the versions the real-node trial ran (containerd 1.6.20,
# runc 1.1.5, plugins 1.1.1). Nothing here is started: each test node runs its own
# containerd with its own state (tests/testenv/src/node/).
#
# Already installed: nothing is done. Not root, or not Debian: says what is missing and exits 1.
# Prints the CNI plugin folder on its last line.
set -euo pipefail

packages=(containerd runc containernetworking-plugins iptables ipset redis-tools)
cni_dir=/usr/lib/cni

installed() {
	command -v containerd >/dev/null && command -v runc >/dev/null && command -v ctr >/dev/null &&
		command -v redis-cli >/dev/null && command -v iptables-restore >/dev/null && command -v ipset >/dev/null &&
		[[ -x $cni_dir/bridge && -x $cni_dir/host-local && -x $cni_dir/loopback ]]
}

if ! installed; then
	if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
		echo "install-node-packages.sh: real test nodes need ${packages[*]} (Debian packages);" \
			"run this script as root on Debian/Ubuntu, or install them yourself" >&2
		exit 1
	fi
	echo "install-node-packages.sh: installing ${packages[*]}" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq >&2
	apt-get install -y -qq --no-install-recommends "${packages[@]}" >&2
	# The package enables a system-wide containerd; the tests run their own per node.
	if command -v systemctl >/dev/null && systemctl is-active --quiet containerd 2>/dev/null; then
		systemctl disable --now containerd >&2 || true
	fi
	installed || { echo "install-node-packages.sh: ${packages[*]} installed, but a binary is missing" >&2; exit 1; }
fi
echo "$cni_dir"
