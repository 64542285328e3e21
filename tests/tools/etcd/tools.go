//go:build tools

// Package tools pins the etcd server command hack/build-k8s.sh builds.
package tools

import _ "go.etcd.io/etcd/server/v3"
