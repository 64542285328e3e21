# The two commands a newcomer needs: `make dev` (run the product locally) and `make test`;
# `make test-unit` is the fast tier of the tests, for the edit-compile-test loop.
# Everything the tests need is fetched or built into ~/.cache/valkey-operator/ and reused.
SHELL := /bin/bash
CACHE ?= $(HOME)/.cache/valkey-operator
export VALKEY_BIN_ROOT := $(CACHE)/valkey

.PHONY: test test-unit lint crds tools valkey-bins k8s-bins prometheus-bins dev chart-lint

## test: fetch/build what the tests need, then run every test of the workspace.
## (Benchmarks are compiled by `make lint` but not run here: they print figures, they do not test.)
test: tools
	cargo test --workspace --lib --bins --tests

## test-unit: the fast tier: every crate's unit tests and the integration tests that need no Go
## toolchain and no control plane (pure ones, the in-process HTTPS server, single valkey-server
## processes). The roll tests are left to `make test`: real clusters take minutes.
UNIT_TESTS := crd_drift roll_props roll_heal_props admission_https admission_fuzz engine_protocol valkey_settings node_tls node_credentials docs names
test-unit: valkey-bins
	cargo test --workspace --lib --bins $(addprefix --test ,$(UNIT_TESTS))

## lint: formatting, clippy, and the docs (every intra-doc link resolves, private items included).
lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings -A rustdoc::private-intra-doc-links" cargo doc --workspace --no-deps --document-private-items --quiet

## crds: regenerate the chart's CRD YAML from the binary.
crds:
	cargo run --quiet -- crd > charts/valkey-operator/crds/crds.yaml

## tools: real parts the tests run against, cached by version.
tools: valkey-bins k8s-bins prometheus-bins

valkey-bins:
	hack/fetch-valkey.sh 9.0.0 9.1.2 >/dev/null

## k8s-bins: etcd, kube-apiserver, kube-controller-manager, kubectl, helm (built once, ~25 min cold).
k8s-bins:
	hack/build-k8s.sh >/dev/null

## prometheus-bins: prometheus and promtool for the metrics and alert tests (built once, ~6 min cold).
prometheus-bins:
	hack/build-prometheus.sh >/dev/null

## dev: run the operator against a local control plane with samples applied (Ctrl-C stops).
dev:
	hack/dev.sh

## chart-lint: helm lint the chart with its default values and with cert-manager + ServiceMonitor.
chart-lint: k8s-bins
	helm=$$(hack/build-k8s.sh)/helm; \
	$$helm lint --strict charts/valkey-operator && \
	$$helm lint --strict charts/valkey-operator --set certificate.source=certManager --set serviceMonitor.enabled=true \
		--set prometheusRule.enabled=true --set dashboard.enabled=true
