#!/usr/bin/env bash
# Builds the Kubernetes binaries (tools/kube) and etcd with etcdctl (tools/etcd) from the Go
# module proxy into _output/kube/bin. A cold build takes about 10 minutes on 2 cores (etcd and
# etcdctl: about a minute of it).
#
# Kubernetes and etcd each have their own stamp (.kube.stamp, .etcd.stamp): a hash of their pins
# and of the function below that builds them, so a change to one rebuilds only that one, and
# edits elsewhere in this script rebuild nothing. .stamp is written last, when everything is
# built (scripts and tests wait for it).
#
# Decisions: binaries are static (CGO_ENABLED=0, as upstream release builds of the control plane)
# so that they go into single-layer images without glibc; symbols are stripped; the
# component-base version ldflags make them report v1.34.4 instead of v0.0.0-master.
#
# --adopt-kube marks the Kubernetes binaries present as built from the current pins without
# building them: for a machine whose binaries an earlier version of this script (one stamp for
# everything) built from the same tools/kube pins. It checks that kube-apiserver reports the
# pinned version.
set -euo pipefail
cd "$(dirname "$0")/.."

out=_output/kube/bin
kube_bins=(kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubeadm kubelet kubectl)
etcd_bins=(etcd etcdctl)

build_kube() {
  local version minor ldflags
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
  echo "build-kube: building Kubernetes $version into $out (cold: about 10 minutes, then cached)"
  (cd tools/kube && CGO_ENABLED=0 go build -o "../../$out/" -ldflags "$ldflags" \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kube-proxy \
    k8s.io/kubernetes/cmd/kubeadm \
    k8s.io/kubernetes/cmd/kubelet \
    k8s.io/kubernetes/cmd/kubectl)
}

# etcdctl goes into the etcd image, as upstream's: the CLI runs it in a control plane's etcd
# pod to remove the etcd member of a control plane it scales down (internal/kube/etcdmember).
build_etcd() {
  echo "build-kube: building etcd and etcdctl into $out (cold: about a minute, then cached)"
  (cd tools/etcd && CGO_ENABLED=0 go build -o "../../$out/etcd" -ldflags "-s -w" .)
  (cd tools/etcd && CGO_ENABLED=0 go build -o "../../$out/etcdctl" -ldflags "-s -w" ./etcdctl)
}

kube_want=$({ cat tools/kube/go.mod tools/kube/go.sum; declare -f build_kube; } | sha256sum | cut -d' ' -f1)
etcd_want=$({ cat tools/etcd/go.mod tools/etcd/go.sum tools/etcd/main.go tools/etcd/etcdctl/main.go; declare -f build_etcd; } | sha256sum | cut -d' ' -f1)

# current STAMP WANT BINS...: whether every binary exists and the stamp holds the wanted hash.
current() {
  local stamp=$1 want=$2 b
  shift 2
  for b in "$@"; do [ -x "$out/$b" ] || return 1; done
  [ "$(cat "$out/$stamp" 2>/dev/null)" = "$want" ]
}

mkdir -p "$out"
if [ "${1:-}" = "--adopt-kube" ]; then
  for b in "${kube_bins[@]}"; do [ -x "$out/$b" ] || { echo "build-kube: $out/$b missing, nothing to adopt" >&2; exit 1; }; done
  version=$(go -C tools/kube list -m -f "{{.Version}}" k8s.io/kubernetes)
  if ! "$out/kube-apiserver" --version | grep -qx "Kubernetes $version"; then
    echo "build-kube: $out/kube-apiserver is not $version; build instead" >&2
    exit 1
  fi
  echo "$kube_want" > "$out/.kube.stamp"
  echo "build-kube: adopted the Kubernetes $version binaries in $out"
  exit 0
fi

if current .kube.stamp "$kube_want" "${kube_bins[@]}" && current .etcd.stamp "$etcd_want" "${etcd_bins[@]}" &&
  [ -f "$out/.stamp" ]; then
  exit 0
fi
rm -f "$out/.stamp"
start=$(date +%s)
if ! current .etcd.stamp "$etcd_want" "${etcd_bins[@]}"; then
  rm -f "$out/.etcd.stamp"
  build_etcd
  echo "$etcd_want" > "$out/.etcd.stamp"
fi
if ! current .kube.stamp "$kube_want" "${kube_bins[@]}"; then
  rm -f "$out/.kube.stamp"
  build_kube
  echo "$kube_want" > "$out/.kube.stamp"
fi
echo "$kube_want $etcd_want" > "$out/.stamp"
echo "build-kube: done in $(($(date +%s) - start)) s"
