//go:build tools

// Package tools pins the helm command hack/build-k8s.sh builds.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
