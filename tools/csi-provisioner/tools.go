//go:build tools

// Package tools pins github.com/kubernetes-csi/external-provisioner/v6, whose command csi-provisioner is built with
// `go build github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner` from this module (hack/build-images.sh).
package tools

import _ "github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner"
