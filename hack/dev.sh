#!/usr/bin/env bash
# `make dev`: the whole product on this machine. Builds what is missing, starts a real
# control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) and nodes,
# installs the CRDs and the validating webhook, runs the operator against it, applies
# config/samples/, and stays up until Ctrl-C, then stops everything it started.
# Nodes: DEV_NODES=real (the default as root on Linux): six real nodes, two in each of zones
# a, b and c, each in a network namespace of its own (kubelet, containerd, runc, CNI, and
# kube-router's firewall enforcing NetworkPolicies; Pods are containers on 198.18.0.0/15;
# the samples ask for 6 CPUs and a roll surges more, and each node offers this machine's CPUs);
# DEV_NODES=test: the test kubelet (Pods are local valkey-server processes; quick, no root).
# VALKEY_OPERATOR_BIN overrides the operator binary (default: the workspace's debug build).
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"
dev_dir="$repo_root/.dev"
mkdir -p "$dev_dir"
rm -f "$dev_dir/kubeconfig"

log() { echo "dev: $*" >&2; }
die() { echo "dev: ERROR: $*" >&2; exit 1; }

testenv_pid=""
operator_pid=""
cleanup() {
	trap - EXIT INT TERM
	log "stopping"
	[[ -n "$operator_pid" ]] && kill -TERM "$operator_pid" 2>/dev/null || true
	# testenv stops the kubelet's valkey-servers and the control plane on SIGTERM.
	[[ -n "$testenv_pid" ]] && kill -TERM "$testenv_pid" 2>/dev/null || true
	wait 2>/dev/null || true
	rm -f "$dev_dir/kubeconfig"
	log "stopped; nothing left running"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

nodes="${DEV_NODES:-}"
if [[ -z "$nodes" ]]; then
	if [[ $(uname -s) == Linux && $(id -u) -eq 0 ]]; then nodes=real; else nodes=test; fi
fi
case "$nodes" in
real) node_flags=(--real-nodes a,b,c,a,b,c --enforce-network-policies) ;;
test) node_flags=(--kubelet) ;;
*) die "DEV_NODES must be real or test, not '$nodes'" ;;
esac

log "fetching Valkey binaries and building the control plane (first run: ~30 min)"
hack/fetch-valkey.sh 9.0.0 9.1.2 >/dev/null
if [[ "$nodes" == real ]]; then
	hack/install-node-packages.sh >/dev/null || die "real nodes need containerd, runc and the CNI plugins (DEV_NODES=test runs without them)"
	crictl=$(hack/build-crictl.sh)
	hack/build-kube-router.sh >/dev/null
fi
bin_dir=$(hack/build-k8s.sh)
cargo build --quiet -p testenv -p valkey-operator --bins
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
operator="${VALKEY_OPERATOR_BIN:-$target_dir/debug/valkey-operator}"
kubectl="$bin_dir/kubectl"

if [[ "$nodes" == real ]]; then
	log "starting the control plane and six real nodes in zones a, b, c (DEV_NODES=test: the test kubelet instead)"
else
	log "starting the control plane and the test kubelet (Pods as local processes)"
fi
"$target_dir/debug/testenv" up "${node_flags[@]}" --bin-dir "$bin_dir" --kubeconfig-out "$dev_dir/kubeconfig" \
	>"$dev_dir/testenv.env" 2>"$dev_dir/testenv.log" &
testenv_pid=$!
for _ in $(seq 1 1500); do
	[[ -s "$dev_dir/kubeconfig" ]] && break
	kill -0 "$testenv_pid" 2>/dev/null || die "the control plane failed to start:
$(tail -n 30 "$dev_dir/testenv.log")"
	sleep 0.2
done
[[ -s "$dev_dir/kubeconfig" ]] || die "the control plane and nodes were not ready after 300s (see .dev/testenv.log)"
export KUBECONFIG="$dev_dir/kubeconfig"
# The API server presents a client certificate of its own CA to webhooks; the operator then
# refuses webhook calls from anyone else (as `--webhook-client-ca` does in the chart).
for _ in $(seq 1 50); do grep -q '^DATA_DIR=' "$dev_dir/testenv.env" && break; sleep 0.1; done
plane_dir=$(sed -n 's/^DATA_DIR=//p' "$dev_dir/testenv.env")
[[ -s "$plane_dir/webhook-client-ca.crt" ]] || die "the control plane wrote no webhook client CA"

# The operator's CLI contract: crd, certs, webhook-config, serve.
if ! "$operator" crd >"$dev_dir/crds.yaml" 2>"$dev_dir/operator-crd.err" \
	|| ! grep -q "kind: CustomResourceDefinition" "$dev_dir/crds.yaml"; then
	die "'valkey-operator crd' printed no CRDs: this build of the operator lacks the
     subcommands make dev needs (crd, certs, webhook-config, serve). $(head -c 300 "$dev_dir/operator-crd.err")"
fi
log "installing the CRDs"
"$kubectl" apply -f "$dev_dir/crds.yaml" >/dev/null
"$kubectl" wait --for condition=established --timeout=60s crd --all >/dev/null

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$operator" certs --out "$dev_dir/certs" --dns localhost --ip 127.0.0.1 \
	|| die "'valkey-operator certs' failed"
log "starting the operator on https://127.0.0.1:$port"
# The operator's own namespace, as the chart's instructions install it: its Lease and each
# cluster's private credentials Secret live there (where `kubectl valkey` looks by default).
"$kubectl" create namespace valkey-operator --dry-run=client -o yaml | "$kubectl" apply -f - >/dev/null
"$operator" serve --listen "127.0.0.1:$port" --namespace valkey-operator \
	--tls-cert "$dev_dir/certs/tls.crt" --tls-key "$dev_dir/certs/tls.key" \
	--webhook-client-ca "$plane_dir/webhook-client-ca.crt" \
	>"$dev_dir/operator.log" 2>&1 &
operator_pid=$!
for _ in $(seq 1 150); do
	curl -sf --cacert "$dev_dir/certs/ca.crt" "https://127.0.0.1:$port/readyz" >/dev/null && break
	kill -0 "$operator_pid" 2>/dev/null || die "the operator exited:
$(tail -n 30 "$dev_dir/operator.log")"
	sleep 0.2
done
curl -sf --cacert "$dev_dir/certs/ca.crt" "https://127.0.0.1:$port/readyz" >/dev/null \
	|| die "the operator was not ready (/readyz) within 30s (see .dev/operator.log)"

log "registering the validating webhook"
"$operator" webhook-config --url "https://127.0.0.1:$port" --ca-file "$dev_dir/certs/ca.crt" \
	| "$kubectl" apply -f - >/dev/null
log "applying config/samples/"
"$kubectl" apply -f config/samples/
# /metrics answers only callers the API server allows to get it (as the chart's
# metrics-reader ClusterRole does for Prometheus): a ServiceAccount for reading it by hand.
"$kubectl" apply -f - >/dev/null <<'YAML'
apiVersion: v1
kind: ServiceAccount
metadata: {name: metrics-reader, namespace: default}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: valkey-operator-metrics-reader}
rules: [{nonResourceURLs: [/metrics], verbs: [get]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: valkey-operator-metrics-reader}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: valkey-operator-metrics-reader}
subjects: [{kind: ServiceAccount, name: metrics-reader, namespace: default}]
YAML

cat <<EOF

The Valkey operator is running against a real Kubernetes $("$kubectl" version -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])').
In another terminal:

  export KUBECONFIG=$dev_dir/kubeconfig
  export PATH=$bin_dir:\$PATH      # kubectl and helm built for this control plane
  kubectl get valkeyimages,valkeyconfigs
  kubectl get valkeyclusters -A -w
  kubectl get valkeynodes,pods -n team-payments -o wide

$(if [[ "$nodes" == real ]]; then
	echo "Pods run as containers on real nodes (kubectl get nodes -o wide), each at its own address"
	echo "on 198.18.0.0/15, reachable from this machine. A node's containers, as its kubelet sees them:"
	sed -n "s|.*real node \([^ ]*\) Ready .*logs in \([^)]*\)).*|  \1: $crictl --runtime-endpoint unix://\2/containerd.sock ps|p" "$dev_dir/testenv.log"
	echo "No node lets anyone in"
else
	echo "Pods run as local valkey-server processes on 127.1.x.y (the Pod IP). No node lets anyone in"
fi)
without a password; with any Valkey client and the operator's own login (cluster commands,
no keys; kept in the operator's namespace, where the teams' RBAC does not reach), e.g.:
  redis-cli -h <a sessions Pod's IP> --user valkey-operator \\
    --pass "\$(kubectl get secret team-payments.sessions -n valkey-operator \\
              -o jsonpath='{.data.operator-password}' | base64 -d)" cluster nodes
(applications get users of their own in spec.acl: see docs/tenants.md, Credentials).
Metrics:
  curl --cacert $dev_dir/certs/ca.crt -H "Authorization: Bearer \$(kubectl create token metrics-reader)" \\
    https://127.0.0.1:$port/metrics
Logs: .dev/operator.log (operator), .dev/testenv.log (control plane and nodes; each real
node's kubelet.log and containerd.log are in the folder it names).
Press Ctrl-C to stop and clean up.
EOF

# Stay up until Ctrl-C, or until one of the two exits by itself. (A foreground sleep, not
# `wait`, so that Ctrl-C reliably runs the INT trap before the loop looks again.)
while kill -0 "$testenv_pid" 2>/dev/null && kill -0 "$operator_pid" 2>/dev/null; do
	sleep 1
done
log "a component exited on its own; see .dev/testenv.log and .dev/operator.log"
exit 1
