#!/usr/bin/env bash
# Builds the node images of the local provider into _output/images (docker archives + index.json,
# see internal/nodeimage and docs/local-provider.md "Images"): the Kubernetes images from
# _output/kube/bin (hack/build-kube.sh; $CONSTELLATION_KUBE_BIN overrides), CoreDNS (tools/coredns,
# rebuilt only when its pins or this script change), pause, the e2e hello server and, when their
# commands exist, our services. Every binary is static (CGO_ENABLED=0). Archives whose inputs did
# not change are kept, so a warm run takes a few seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

out=_output/images
bin=$out/bin
kube=${CONSTELLATION_KUBE_BIN:-_output/kube/bin}
mkdir -p "$bin"

# CoreDNS: about 2 minutes cold on 2 cores, cached by a stamp like hack/build-kube.sh.
stamp=$bin/.coredns.stamp
want=$(cat tools/coredns/go.mod tools/coredns/go.sum tools/coredns/main.go hack/build-images.sh | sha256sum | cut -d' ' -f1)
if [ ! -x "$bin/coredns" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "build-images: building CoreDNS (cold: about 2 minutes, then cached)"
  rm -f "$stamp"
  (cd tools/coredns && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "../../$bin/coredns" .)
  echo "$want" > "$stamp"
fi

# Our small binaries: go's build cache makes these quick when nothing changed.
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin/pause" ./cmd/pause
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin/hello" ./test/e2e/hello
services=()
for s in joinservice keyservice verificationservice verifyservice; do
  if [ -d "cmd/$s" ]; then
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin/$s" "./cmd/$s"
    services+=("$bin/$s")
  fi
done

go run ./hack/images -out "$out" -kube-bin "$kube" -pause "$bin/pause" -coredns "$bin/coredns" \
  -nft "$(command -v nft)" -hello "$bin/hello" -services "$(IFS=,; echo "${services[*]}")"
