//go:build tools

// Package tools pins github.com/kubernetes-csi/external-attacher/v4, whose command csi-attacher is built with
// `go build github.com/kubernetes-csi/external-attacher/v4/cmd/csi-attacher` from this module (hack/build-images.sh).
package tools

import _ "github.com/kubernetes-csi/external-attacher/v4/cmd/csi-attacher"
