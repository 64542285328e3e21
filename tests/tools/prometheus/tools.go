//go:build tools

// Package tools pins the prometheus and promtool commands hack/build-prometheus.sh builds.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
