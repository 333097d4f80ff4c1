#!/usr/bin/env bash
# Builds the Kubernetes conformance suite of one Kubernetes version (default: the default one)
# and its test images, from the Go module proxy and the build machine's Debian packages:
#
#   _output/conformance/<version>/e2e.test           k8s.io/kubernetes/test/e2e's test binary
#   _output/conformance/<version>/ginkgo             the ginkgo CLI of the version's ginkgo
#   _output/conformance/<version>/agnhost            the suite's test image program
#   _output/conformance/<version>/sample-apiserver   the aggregator test's API server, at the
#                                                    version of the suite's image (1.29.2:
#                                                    tools/conformance/sample-apiserver; a
#                                                    newer one needs RBAC the test does not grant)
#   _output/conformance/<version>/nnp                test/conformance/nnp
#   _output/conformance/<version>/busybox            upstream's busybox (tools/conformance/busybox)
#   _output/conformance/<version>/localhost.{crt,key} agnhost porter's TLS certificate
#   _output/conformance/<version>/images/*.tar       the images (internal/conformance)
#   _output/conformance/<version>/repo-list.yaml     the suite's image-repository override
#   _output/conformance/<version>/skip.regex         the tests skipped by name
#
# tools/conformance/<version> pins them, with the staging modules replaced by their published
# versions as tools/kube/<version> does; same build flags as hack/build-kube.sh, so that both
# share the build cache (a cold e2e.test after the Kubernetes binaries: about 2 minutes).
# A stamp (hash of the pins and of build()) skips the build when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
version=${1:-$(KUBE_VERSIONS=default go run ./hack/kubeversions | cut -d' ' -f1)}
pins=tools/conformance/$version
out=_output/conformance/$version
if [ ! -d "$pins" ]; then
  echo "build-conformance: no pins for Kubernetes $version ($pins): the suite is pinned for $(ls tools/conformance | tr '\n' ' ')" >&2
  exit 1
fi

build() {
  local minor
  minor=$(echo "$version" | cut -d. -f2)
  (cd "$pins" && CGO_ENABLED=0 go test -c -trimpath -gcflags=all=-dwarf=false -o "$repo/$out/e2e.test" \
    -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor" \
    k8s.io/kubernetes/test/e2e)
  (cd "$pins" && CGO_ENABLED=0 go build -trimpath -gcflags=all=-dwarf=false -ldflags "-s -w" -o "$repo/$out/" \
    github.com/onsi/ginkgo/v2/ginkgo k8s.io/kubernetes/test/images/agnhost)
  (cd tools/conformance/sample-apiserver && CGO_ENABLED=0 go build -trimpath -gcflags=all=-dwarf=false -ldflags "-s -w" \
    -o "$repo/$out/sample-apiserver" k8s.io/sample-apiserver)
}

mkdir -p "$out"
stamp=$out/.stamp
want=$({ cat "$pins/go.mod" "$pins/go.sum" "$pins/tools.go" tools/conformance/sample-apiserver/go.*; declare -f build; } | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || ! [ -x "$out/e2e.test" ]; then
  rm -f "$stamp"
  echo "build-conformance: building e2e.test, ginkgo, agnhost and sample-apiserver of Kubernetes $version (after the Kubernetes binaries: about 2 minutes, then cached)"
  t=$(date +%s)
  build
  echo "build-conformance: built in $(($(date +%s) - t)) s"
  echo "$want" > "$stamp"
fi
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/nnp" ./test/conformance/nnp

# busybox: upstream's source at the pinned hash (tools/conformance/busybox/source), default
# configuration, static; about 40 s on 2 cores, then cached by a stamp.
build_busybox() {
  local url sha256 tmp
  url=$(sed -n 's/^url=//p' tools/conformance/busybox/source)
  sha256=$(sed -n 's/^sha256=//p' tools/conformance/busybox/source)
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  curl -fsSL --retry 3 -o "$tmp/src.tar.bz2" "$url"
  echo "$sha256  $tmp/src.tar.bz2" | sha256sum -c --quiet
  tar -xjf "$tmp/src.tar.bz2" -C "$tmp"
  (cd "$tmp"/busybox-* && make defconfig >/dev/null &&
    sed -i 's/^# CONFIG_STATIC is not set/CONFIG_STATIC=y/' .config &&
    make -j"$(nproc)" >/dev/null 2>"$tmp/build.log" || { tail -20 "$tmp/build.log" >&2; exit 1; })
  install -m 0755 "$tmp"/busybox-*/busybox "$out/busybox"
}
bbstamp=$out/.busybox.stamp
bbwant=$({ cat tools/conformance/busybox/source; declare -f build_busybox; } | sha256sum | cut -d' ' -f1)
if [ "$(cat "$bbstamp" 2>/dev/null)" != "$bbwant" ] || ! [ -x "$out/busybox" ]; then
  rm -f "$bbstamp"
  echo "build-conformance: building busybox from source (about 40 s, then cached)"
  build_busybox
  echo "$bbwant" > "$bbstamp"
fi
# agnhost's porter and netexec serve TLS with the certificate beside their source.
porter=$(cd "$pins" && go list -f '{{.Dir}}' k8s.io/kubernetes/test/images/agnhost/porter)
install -m 0644 "$porter/localhost.crt" "$porter/localhost.key" "$out/"
# kitten's and nautilus' pages (test/images of the Kubernetes module).
kubemod=$(cd "$pins" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)
for img in kitten nautilus; do
  mkdir -p "$out/test-images/$img/html"
  install -m 0644 "$kubemod/test/images/$img/html/"* "$out/test-images/$img/html/"
done
etcd=$(KUBE_VERSIONS=$version go run ./hack/kubeversions | cut -d' ' -f2)
go run ./hack/conformance images -dir "$out" -etcd "_output/etcd/$etcd/etcd"
