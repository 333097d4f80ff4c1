//go:build tools

// Package tools pins github.com/rancher/local-path-provisioner, a program built with
// `go build github.com/rancher/local-path-provisioner` from this module (hack/build-images.sh).
package tools

import _ "github.com/rancher/local-path-provisioner"
