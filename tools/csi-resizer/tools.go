//go:build tools

// Package tools pins github.com/kubernetes-csi/external-resizer/v2, whose command csi-resizer is built with
// `go build github.com/kubernetes-csi/external-resizer/v2/cmd/csi-resizer` from this module (hack/build-images.sh).
package tools

import _ "github.com/kubernetes-csi/external-resizer/v2/cmd/csi-resizer"
