#!/usr/bin/env bash
# Builds and tests a relying party's module (test/consumer) against the public verifier
# (pkg/, its own module) as published: pkg is written into a file-based module proxy
# (tools/devtools/modproxy) and the consumer gets it through GOPROXY, with no replace line
# and nothing else of this repository. Fails if `go list -m all` fails in the consumer, if
# Kubernetes enters pkg's dependencies, or if gRPC enters the verifier's (everything but the
# verification client pkg/verify and the attested channel pkg/atls, which speak gRPC).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
version=$(cd tools/devtools && go run ./modproxy -module-dir "$root/pkg" -out "$work/proxy")
echo "check-consumer: published github.com/openconstellation/constellation/pkg@$version to a file proxy"
cp -r test/consumer "$work/consumer"
cd "$work/consumer"
# The file proxy first; every other module as usual. pkg is in no checksum database.
export GOPROXY="file://$work/proxy,$(go env GOPROXY)" GONOSUMDB=github.com/openconstellation/constellation GOFLAGS=-mod=mod
go get "github.com/openconstellation/constellation/pkg@$version"
go mod tidy
go list -m all > "$work/modules"
if grep -E '^(k8s\.io|sigs\.k8s\.io/(controller|structured)|github\.com/openconstellation/constellation) ' "$work/modules"; then
  echo "check-consumer: the consumer's module graph holds Kubernetes or the root module" >&2; exit 1
fi
bad=0
for p in $(go list github.com/openconstellation/constellation/pkg/...); do
  deps=$(go list -deps "$p")
  if grep -qE '^k8s\.io/' <<<"$deps"; then echo "check-consumer: $p depends on Kubernetes" >&2; bad=1; fi
  case "$p" in
    */pkg/verify|*/pkg/atls|*/pkg/api/verify/verifypb|*/pkg/untrusted/untrustedgrpc) ;;
    *) if grep -qE '^google\.golang\.org/grpc' <<<"$deps"; then echo "check-consumer: $p depends on gRPC" >&2; bad=1; fi ;;
  esac
done
[ "$bad" = 0 ]
go vet ./...
go test -count=1 ./...
echo "check-consumer: a separate module builds and tests against pkg@$version"
