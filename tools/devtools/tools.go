//go:build tools

// Package devtools pins the versions of the Go tools the build uses (linters and protoc
// plugins, benchstat). `make tools` builds them into _output/bin from this module, so every machine
// runs the same versions.
package devtools

import (
	_ "golang.org/x/perf/cmd/benchstat"
	_ "google.golang.org/grpc/cmd/protoc-gen-go-grpc"
	_ "google.golang.org/protobuf/cmd/protoc-gen-go"
	_ "honnef.co/go/tools/cmd/staticcheck"
)
