#!/usr/bin/env bash
# Builds the Kubernetes binaries (tools/kube) and etcd (tools/etcd) from the Go module proxy into
# _output/kube/bin. A cold build takes about 10 minutes on 2 cores; the result is reused until a
# pin (go.mod/go.sum) or this script changes, so it runs once per machine (and once per CI job).
#
# Decisions: binaries are static (CGO_ENABLED=0, as upstream release builds of the control plane)
# so that issue 5 can put them into single-layer images without glibc; symbols are stripped; the
# component-base version ldflags make them report v1.34.4 instead of v0.0.0-master.
set -euo pipefail
cd "$(dirname "$0")/.."

out=_output/kube/bin
stamp=$out/.stamp
want=$(cat tools/kube/go.mod tools/kube/go.sum tools/etcd/go.mod tools/etcd/go.sum hack/build-kube.sh | sha256sum | cut -d' ' -f1)
bins=(kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubeadm kubelet kubectl etcd)
ok=1
for b in "${bins[@]}"; do [ -x "$out/$b" ] || ok=0; done
if ((ok)) && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  exit 0
fi

version=$(go -C tools/kube list -m -f "{{.Version}}" k8s.io/kubernetes)
minor=$(echo "$version" | cut -d. -f2)
ldflags="-s -w \
 -X k8s.io/component-base/version.gitVersion=$version \
 -X k8s.io/component-base/version.gitMajor=1 \
 -X k8s.io/component-base/version.gitMinor=$minor \
 -X k8s.io/component-base/version.gitTreeState=clean \
 -X k8s.io/client-go/pkg/version.gitVersion=$version \
 -X k8s.io/client-go/pkg/version.gitMajor=1 \
 -X k8s.io/client-go/pkg/version.gitMinor=$minor"

mkdir -p "$out"
rm -f "$stamp"
start=$(date +%s)
echo "build-kube: building Kubernetes $version and etcd into $out (cold: about 10 minutes, then cached)"
(cd tools/kube && CGO_ENABLED=0 go build -o "../../$out/" -ldflags "$ldflags" \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kube-proxy \
  k8s.io/kubernetes/cmd/kubeadm \
  k8s.io/kubernetes/cmd/kubelet \
  k8s.io/kubernetes/cmd/kubectl)
(cd tools/etcd && CGO_ENABLED=0 go build -o "../../$out/etcd" -ldflags "-s -w" .)
echo "$want" > "$stamp"
echo "build-kube: done in $(($(date +%s) - start)) s"
