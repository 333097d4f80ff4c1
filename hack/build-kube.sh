#!/usr/bin/env bash
# Builds, for every supported Kubernetes version (internal/kubeversion, printed by
# hack/kubeversions), the Kubernetes binaries from its pin module tools/kube/<version> and the
# etcd and etcdctl its kubeadm expects (tools/etcd/<etcd version>), from the Go module proxy:
#
#   _output/kube/<version>/bin   kube-apiserver kube-controller-manager kube-scheduler kube-proxy
#                                kubeadm kubelet kubectl, etcd etcdctl (hard links)
#   _output/etcd/<etcd version>  etcd etcdctl
#
# A cold build of one Kubernetes version with its etcd takes about 470 s of CPU (2 cores: 4 to 9
# minutes, as busy as the machine is), etcd alone about a minute of it.
#
# Every Kubernetes version and every etcd version has its own stamp (.kube.stamp, .etcd.stamp):
# a hash of its pins and of the function below that builds it, so a change to one version's pins
# rebuilds only that version, and edits elsewhere in this script rebuild nothing.
# _output/kube/<version>/bin/.stamp is written last, when that version's directory is complete.
#
# Decisions: binaries are static (CGO_ENABLED=0, as upstream release builds of the control plane)
# so that they go into single-layer images without glibc; symbols are stripped; the
# component-base version ldflags make them report their version instead of v0.0.0-master.
# -gcflags=all=-dwarf=false: the compiler writes no debug information that the stripping link
# would throw away (7% less compile CPU, measured on etcd). -trimpath, as hack/build-images.sh
# builds CoreDNS and local-path-provisioner with the same flags: the build cache then holds the
# standard library and the packages of the modules they share with etcd and Kubernetes once for
# all of them, instead of once per set of flags.
#
# Seven binaries, not one multi-call binary (as hyperkube was): their links cost about 15 s CPU of
# a cold build of 470 s (on 2 cores), nearly all of it is compiling the packages, which the seven
# share in one go build; one binary would save about 10 s and make each of the four images of
# the control plane and kube-proxy carry all seven commands (150 MB instead of 70 to 100).
#
# Migration from the layout of one version (_output/kube/bin, built by an earlier version of this
# script from the same pins): its binaries are adopted, hard-linked into the new layout without
# building, when each reports the pinned version (the components and the kubelet
# "Kubernetes v1.34.4", etcd "etcd Version: 3.6.5"). _output/kube/bin itself is left as it is
# (other checkouts' tests may still use it); remove it once nothing does.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

kube_bins=(kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubeadm kubelet kubectl)
etcd_bins=(etcd etcdctl)
legacy=_output/kube/bin

# build_kube VERSION OUT: the Kubernetes binaries of tools/kube/VERSION into OUT.
build_kube() {
  local version=$1 out=$2 pinned minor ldflags
  pinned=$(go -C "tools/kube/$version" list -m -f "{{.Version}}" k8s.io/kubernetes)
  if [ "$pinned" != "$version" ]; then
    echo "build-kube: tools/kube/$version pins k8s.io/kubernetes $pinned" >&2
    return 1
  fi
  minor=$(echo "$version" | cut -d. -f2)
  ldflags="-s -w \
 -X k8s.io/component-base/version.gitVersion=$version \
 -X k8s.io/component-base/version.gitMajor=1 \
 -X k8s.io/component-base/version.gitMinor=$minor \
 -X k8s.io/component-base/version.gitTreeState=clean \
 -X k8s.io/client-go/pkg/version.gitVersion=$version \
 -X k8s.io/client-go/pkg/version.gitMajor=1 \
 -X k8s.io/client-go/pkg/version.gitMinor=$minor"
  echo "build-kube: building Kubernetes $version into $out (cold: about 8 minutes of CPU, then cached)"
  (cd "tools/kube/$version" && CGO_ENABLED=0 go build -trimpath -gcflags=all=-dwarf=false -o "$repo/$out/" -ldflags "$ldflags" \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kube-proxy \
    k8s.io/kubernetes/cmd/kubeadm \
    k8s.io/kubernetes/cmd/kubelet \
    k8s.io/kubernetes/cmd/kubectl)
}

# build_etcd VERSION OUT: etcd and etcdctl of tools/etcd/VERSION into OUT. etcdctl goes into the
# etcd image, as upstream's: the CLI runs it in a control plane's etcd pod to remove the etcd
# member of a control plane it scales down (internal/kube/etcdmember).
build_etcd() {
  local version=$1 out=$2
  echo "build-kube: building etcd $version and etcdctl into $out (cold: about a minute, then cached)"
  (cd "tools/etcd/$version" && CGO_ENABLED=0 go build -trimpath -gcflags=all=-dwarf=false -o "$repo/$out/etcd" -ldflags "-s -w" .)
  (cd "tools/etcd/$version" && CGO_ENABLED=0 go build -trimpath -gcflags=all=-dwarf=false -o "$repo/$out/etcdctl" -ldflags "-s -w" ./etcdctl)
}

# want FUNCTION DIR: the stamp of what FUNCTION builds from the pin module DIR.
want() {
  { cat "$2/go.mod" "$2/go.sum"; find "$2" -name '*.go' -print0 | sort -z | xargs -0 cat; declare -f "$1"; } |
    sha256sum | cut -d' ' -f1
}

# current DIR STAMP WANT BINS...: whether every binary exists and the stamp holds the wanted hash.
current() {
  local dir=$1 stamp=$2 want=$3 b
  shift 3
  for b in "$@"; do [ -x "$dir/$b" ] || return 1; done
  [ "$(cat "$dir/$stamp" 2>/dev/null)" = "$want" ]
}

# adopt DIR STAMP WANT CHECK BINS...: hard-links BINS from the legacy layout into DIR and stamps
# them, when they are all there and "$legacy/CHECK" reports what the remaining words say.
adopt() {
  local dir=$1 stamp=$2 want=$3 check=$4 expect=$5 b
  shift 5
  for b in "$@"; do [ -x "$legacy/$b" ] || return 1; done
  for b in $check; do
    "$legacy/$b" --version 2>/dev/null | grep -qx "$expect" || return 1
  done
  mkdir -p "$dir"
  for b in "$@"; do ln -f "$legacy/$b" "$dir/$b"; done
  echo "$want" > "$dir/$stamp"
  echo "build-kube: adopted $* ($expect) from $legacy into $dir"
}

# The supported releases, or those $KUBE_VERSIONS names (hack/kubeversions; a bad one fails here).
list=$(go run ./hack/kubeversions)
mapfile -t releases <<<"$list"
start=$(date +%s)
built=0
for line in "${releases[@]}"; do
  read -r version etcd _ <<<"$line"
  kdir=_output/kube/$version/bin
  edir=_output/etcd/$etcd
  kwant=$(want build_kube "tools/kube/$version")
  ewant=$(want build_etcd "tools/etcd/$etcd")
  if current "$kdir" .kube.stamp "$kwant" "${kube_bins[@]}" && current "$edir" .etcd.stamp "$ewant" "${etcd_bins[@]}" &&
    [ "$(cat "$kdir/.stamp" 2>/dev/null)" = "$kwant $ewant" ]; then
    continue
  fi
  rm -f "$kdir/.stamp"
  if ! current "$edir" .etcd.stamp "$ewant" "${etcd_bins[@]}" &&
    ! adopt "$edir" .etcd.stamp "$ewant" etcd "etcd Version: ${etcd#v}" "${etcd_bins[@]}"; then
    rm -f "$edir/.etcd.stamp"
    t=$(date +%s)
    build_etcd "$etcd" "$edir"
    echo "build-kube: etcd $etcd built in $(($(date +%s) - t)) s"
    echo "$ewant" > "$edir/.etcd.stamp"
    built=1
  fi
  if ! current "$kdir" .kube.stamp "$kwant" "${kube_bins[@]}" &&
    ! adopt "$kdir" .kube.stamp "$kwant" "kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubelet" "Kubernetes $version" "${kube_bins[@]}"; then
    rm -f "$kdir/.kube.stamp"
    t=$(date +%s)
    build_kube "$version" "$kdir"
    echo "build-kube: Kubernetes $version built in $(($(date +%s) - t)) s"
    echo "$kwant" > "$kdir/.kube.stamp"
    built=1
  fi
  for b in "${etcd_bins[@]}"; do ln -f "$edir/$b" "$kdir/$b"; done
  echo "$kwant $ewant" > "$kdir/.stamp"
done
if ((built)); then
  echo "build-kube: done in $(($(date +%s) - start)) s"
fi
