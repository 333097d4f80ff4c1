//go:build tools

// Package sampleapiserver pins k8s.io/sample-apiserver for hack/build-conformance.sh.
package sampleapiserver

import _ "k8s.io/sample-apiserver"
