# The two commands a newcomer needs: `make dev` (run the product locally) and `make test`;
# `make test-unit` is the fast tier of the tests, for the edit-compile-test loop.
# Everything the tests need is fetched or built into ~/.cache/valkey-operator/ and reused.
SHELL := /bin/bash
CACHE ?= $(HOME)/.cache/valkey-operator
export VALKEY_BIN_ROOT := $(CACHE)/valkey

.PHONY: test test-binaries test-unit lint crds manifests tools valkey-bins k8s-bins prometheus-bins node-packages kube-router-bin previous-operator dev chart-lint plugin

## test: every test of the workspace, two at a time, longest first (hack/run-tests.py;
## TEST_JOBS=N). The Valkey binaries first (seconds); then the Go-built tools (the control plane,
## Prometheus) and the node packages are built beside the Rust build, at a lower priority, and
## every test that needs none of them runs meanwhile; the previous release's operator (for
## tests/e2e_operator_upgrade.rs) and kube-router (for the tests that enforce NetworkPolicies)
## are built in the background, at the lowest priority, in the moments the tests leave the CPU
## idle: a test that needs one before it is done waits for its build's lock. All of it is cached.
## (Benchmarks are compiled by `make lint` but not run here: they print figures, they do not test.)
TEST_TARGETS := --workspace --lib --bins --tests
E2E_TOOLS := nice -n 10 $(MAKE) --no-print-directory -j4 k8s-bins prometheus-bins node-packages
BACKGROUND := nice -n 19 $(MAKE) --no-print-directory -j2 previous-operator kube-router-bin
test: valkey-bins
	hack/run-tests.py --meanwhile '$(E2E_TOOLS)' --background '$(BACKGROUND)' -- $(TEST_TARGETS)

## test-binaries: compile every test binary without running one.
test-binaries:
	cargo test $(TEST_TARGETS) --no-run

## test-unit: the fast tier: every crate's unit tests and every integration test but the slow
## ones, which the file name marks: `e2e_*` (a control plane, Prometheus) and `cluster_*` (real
## Valkey clusters, minutes each). The rest need at most a valkey-server (tests/house.rs checks).
FAST_TESTS := $(filter-out e2e_% cluster_%,$(basename $(notdir $(wildcard tests/*.rs))))
test-unit: valkey-bins
	cargo test --workspace --lib --bins $(addprefix --test ,$(FAST_TESTS))

## lint: formatting, clippy, the docs (every intra-doc link resolves, private items included) and
## the dependencies' licenses, sources and duplicates (cargo deny, deny.toml).
## The product may not unwrap, expect or panic (Cargo.toml's [workspace.lints]); tests and
## benchmarks report failures that way, so their targets are linted with those three allowed:
## the one place this is said.
TEST_LINT_OPT_OUT := -A clippy::unwrap_used -A clippy::expect_used -A clippy::panic
lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --lib --bins -- -D warnings
	cargo clippy --workspace --tests --benches -- -D warnings $(TEST_LINT_OPT_OUT)
	RUSTDOCFLAGS="-D warnings -A rustdoc::private-intra-doc-links" cargo doc --workspace --no-deps --document-private-items --quiet
	$$(hack/build-cargo-deny.sh) check --hide-inclusion-graph licenses bans sources

## crds: regenerate the chart's CRD YAML from the binary.
crds:
	cargo run --quiet -- crd > charts/valkey-operator/crds/crds.yaml

## manifests: regenerate deploy/operator.yaml, the chart rendered for teams without Helm
## (tests/e2e_helm_chart.rs fails when it is stale).
manifests: k8s-bins
	hack/render-manifests.sh > deploy/operator.yaml

## tools: real parts the tests run against, cached by version.
tools: valkey-bins k8s-bins prometheus-bins node-packages kube-router-bin

valkey-bins:
	hack/fetch-valkey.sh 9.0.0 9.1.2 >/dev/null

## k8s-bins: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl, helm
## (built once, ~25 min cold).
k8s-bins:
	hack/build-k8s.sh >/dev/null

## node-packages: containerd, runc and the CNI plugins the real test nodes run (Debian's; root).
node-packages:
	hack/install-node-packages.sh >/dev/null

## kube-router-bin: kube-router, whose firewall enforces NetworkPolicies on a real test node
## (tests/e2e_network_policy.rs, tests/e2e_hostile_tenant.rs; built once, ~2 min cold).
kube-router-bin:
	hack/build-kube-router.sh >/dev/null

## previous-operator: the operator of hack/previous-operator.commit, which
## tests/e2e_operator_upgrade.rs upgrades from (a debug build, ~5 min once).
previous-operator:
	hack/build-previous-operator.sh $$(cat hack/previous-operator.commit) >/dev/null

## prometheus-bins: prometheus and promtool for the metrics and alert tests (built once, ~6 min cold).
prometheus-bins:
	hack/build-prometheus.sh >/dev/null

## plugin: build `kubectl valkey` (the binary kubectl-valkey) and install it into $(PREFIX)/bin,
## where kubectl finds it on the PATH (PREFIX defaults to ~/.local).
PREFIX ?= $(HOME)/.local
plugin:
	cargo build --release --bin kubectl-valkey
	install -D -m 0755 target/release/kubectl-valkey $(PREFIX)/bin/kubectl-valkey
	@echo "installed $(PREFIX)/bin/kubectl-valkey: try kubectl valkey --help"

## dev: run the operator against a local control plane with samples applied (Ctrl-C stops).
dev:
	hack/dev.sh

## chart-lint: helm lint the chart with its default values and with cert-manager + ServiceMonitor.
chart-lint: k8s-bins
	helm=$$(hack/build-k8s.sh)/helm; \
	$$helm lint --strict charts/valkey-operator && \
	$$helm lint --strict charts/valkey-operator --set certificate.source=certManager --set serviceMonitor.enabled=true \
		--set prometheusRule.enabled=true --set dashboard.enabled=true
