#!/usr/bin/env bash
# Builds the node images of the local provider into _output/images (docker archives + index.json,
# see internal/nodeimage and docs/local-provider.md "Images"): for every supported Kubernetes
# version (internal/kubeversion, printed by hack/kubeversions) its Kubernetes and etcd images from
# _output/kube/<version>/bin (hack/build-kube.sh; $CONSTELLATION_KUBE_DIR overrides _output/kube)
# and its CoreDNS (tools/coredns/<version>, each rebuilt only when its pins or its build line
# change), local-path-provisioner and the CSI sidecars (tools/<name>, likewise), then pause, the
# e2e hello server and, when their commands exist, our services. Every binary is static
# (CGO_ENABLED=0). Archives whose inputs did not change are kept, so a warm run takes a few
# seconds.
#
# `build-images.sh bins` builds the binaries only, not the archives: `make up` runs it beside
# hack/build-kube.sh, as these builds need none of Kubernetes' (Makefile, target up).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

out=_output/images
bin=$out/bin
kube=${CONSTELLATION_KUBE_DIR:-_output/kube}
mkdir -p "$bin"

# build_coredns VERSION: tools/coredns/VERSION into $bin/coredns-VERSION.
build_coredns() {
  (cd "tools/coredns/$1" && CGO_ENABLED=0 go build -trimpath -gcflags=all=-dwarf=false -ldflags "-s -w" -o "$repo/$bin/coredns-$1" .)
}

# CoreDNS: about 2 minutes cold per version on 2 cores, cached by a stamp like hack/build-kube.sh.
# A CoreDNS the earlier layout built ($bin/coredns) is adopted (hard-linked) when it reports the
# version.
# The supported releases, or those $KUBE_VERSIONS names (hack/kubeversions; a bad one fails here).
list=$(go run ./hack/kubeversions)
mapfile -t releases <<<"$list"
for line in "${releases[@]}"; do
  read -r _ _ coredns _ <<<"$line"
  stamp=$bin/.coredns-$coredns.stamp
  want=$({ cat "tools/coredns/$coredns/go.mod" "tools/coredns/$coredns/go.sum" "tools/coredns/$coredns/main.go"; declare -f build_coredns; } |
    sha256sum | cut -d' ' -f1)
  if [ -x "$bin/coredns-$coredns" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    continue
  fi
  rm -f "$stamp"
  if [ -x "$bin/coredns" ] && "$bin/coredns" -version 2>/dev/null | grep -qx "CoreDNS-${coredns#v}"; then
    ln -f "$bin/coredns" "$bin/coredns-$coredns"
    echo "build-images: adopted $bin/coredns (CoreDNS-${coredns#v}) as $bin/coredns-$coredns"
  else
    echo "build-images: building CoreDNS $coredns (cold: about 2 minutes, then cached)"
    t=$(date +%s)
    build_coredns "$coredns"
    echo "build-images: CoreDNS $coredns built in $(($(date +%s) - t)) s"
  fi
  echo "$want" > "$stamp"
done

# local-path-provisioner (tools/local-path-provisioner, the default StorageClass's provisioner,
# in the services image): about 1.5 minutes cold, cached by a stamp like CoreDNS.
build_provisioner() {
  (cd tools/local-path-provisioner &&
    v=$(go list -m -f '{{.Version}}' github.com/rancher/local-path-provisioner) &&
    CGO_ENABLED=0 go build -trimpath -gcflags=all=-dwarf=false -ldflags "-s -w -X main.VERSION=$v" -o "$repo/$bin/local-path-provisioner" github.com/rancher/local-path-provisioner)
}
stamp=$bin/.local-path-provisioner.stamp
want=$({ cat tools/local-path-provisioner/go.mod tools/local-path-provisioner/go.sum; declare -f build_provisioner; } | sha256sum | cut -d' ' -f1)
if ! [ -x "$bin/local-path-provisioner" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  rm -f "$stamp"
  echo "build-images: building local-path-provisioner (cold: about 1.5 minutes, then cached)"
  t=$(date +%s)
  build_provisioner
  echo "build-images: local-path-provisioner built in $(($(date +%s) - t)) s"
  echo "$want" > "$stamp"
fi

# The Kubernetes CSI sidecars beside the encrypted-volume driver's controller (tools/<sidecar>,
# each a module of its own pinning the upstream release and its replace directives; in the
# services image; docs/volumes.md "Deployment"): csi-provisioner, csi-attacher, csi-resizer.
# Each 4 to 6 minutes cold on 2 cores shared with other builds, then cached by a stamp like
# CoreDNS.
# build_sidecar NAME MODULE: tools/NAME's MODULE/cmd/NAME into $bin/NAME, its version as upstream
# stamps it (main.version).
build_sidecar() {
  (cd "tools/$1" &&
    v=$(go list -m -f '{{.Version}}' "$2") &&
    CGO_ENABLED=0 go build -trimpath -gcflags=all=-dwarf=false -ldflags "-s -w -X main.version=$v" -o "$repo/$bin/$1" "$2/cmd/$1")
}
sidecars=(
  "csi-provisioner github.com/kubernetes-csi/external-provisioner/v6"
  "csi-attacher github.com/kubernetes-csi/external-attacher/v4"
  "csi-resizer github.com/kubernetes-csi/external-resizer/v2"
)
for sidecar in "${sidecars[@]}"; do
  read -r name module <<<"$sidecar"
  stamp=$bin/.$name.stamp
  want=$({ cat "tools/$name/go.mod" "tools/$name/go.sum"; echo "$module"; declare -f build_sidecar; } | sha256sum | cut -d' ' -f1)
  if [ -x "$bin/$name" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    continue
  fi
  rm -f "$stamp"
  echo "build-images: building $name (cold: 4 to 6 minutes, then cached)"
  t=$(date +%s)
  build_sidecar "$name" "$module"
  echo "build-images: $name built in $(($(date +%s) - t)) s"
  echo "$want" > "$stamp"
done

# Our small binaries: go's build cache makes these quick when nothing changed. One go build for
# all (each binary is named by its package), with the flags of `make build` (CGO_ENABLED=0,
# -trimpath), so that both compile our packages once.
services=() pkgs=(./cmd/pause ./test/e2e/hello)
for s in joinservice keyservice verificationservice verifyservice volumehelper csidriver; do
  if [ -d "cmd/$s" ]; then
    pkgs+=("./cmd/$s")
    services+=("$bin/$s")
  fi
done
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin/" "${pkgs[@]}"
services+=("$bin/local-path-provisioner" "$bin/csi-provisioner" "$bin/csi-attacher" "$bin/csi-resizer")

if [ "${1:-}" = bins ]; then
  exit 0
fi

versions=()
for line in "${releases[@]}"; do versions+=("${line%% *}"); done
go run ./hack/images -out "$out" -kube-dir "$kube" -pause "$bin/pause" -coredns-dir "$bin" \
  -nft "$(command -v nft)" -hello "$bin/hello" -services "$(IFS=,; echo "${services[*]}")" \
  -versions "$(IFS=,; echo "${versions[*]}")"
