#!/usr/bin/env bash
# Installs what the build and the tests need, idempotently: "debs", the Debian packages that are
# missing, and "devtools", the pinned Go tools (tools/devtools) in _output/bin; with no argument
# both. Safe to run on every `make` call: when everything is present it only checks and returns.
#
# Why two parts: building Kubernetes, the images and our binaries (`make up`) needs only the
# Debian packages. The Go tools are for lint, `make proto` and the benchmarks, and building them
# cold cost about 30 s of a fresh `make up` on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages: swtpm for the software TPMs of the tests and the local nodes, tpm2-tools for
# debugging them, protoc for `make proto`, gcc + libssl-dev for the go-tpm-tools simulator (cgo),
# cryptsetup (LUKS2) + e2fsprogs (mkfs.ext4, e2fsck, resize2fs) + mount (losetup) and gocryptfs +
# fuse3 for the node state storage and the encrypted volumes;
# containerd + runc, the CNI plugins (bridge, host-local, loopback) and util-linux's
# nsenter/unshare for the local provider's sandbox nodes, slirp4netns for their NAT (the
# uplink); nftables (nft) and netbase (/etc/protocols) for the kube-proxy image and the NAT;
# iptables for the CNI portmap plugin (hostPort); for the conformance suite's test images
# (internal/conformance): make, bzip2 and libc6-dev to build busybox from source, curl to fetch
# it, and bash, curl, bind9-dnsutils (dig) and netcat-openbsd, which go into the images.
# The VM image (make vm-image, docs/vm-image.md): mmdebstrap for the Debian tree, erofs-utils
# for its root filesystem (cryptsetup-bin's veritysetup makes the hash tree), systemd-boot-efi
# for the UKI's stub and binutils (objcopy) to assemble it, dosfstools + mtools for the ESP
# (no vfat in the host kernel), systemd (systemd-repart, systemd-measure) and fdisk (sfdisk)
# for the GPT disk. The QEMU provider's machines (internal/provider/qemu): qemu-system-x86,
# its firmware ovmf, and dnsmasq-base (the machines' DHCP server). The measured-boot
# prediction's tests (internal/measuredboot): pesign and osslsigncode (Authenticode). The fixed
# VHD footer's test (internal/vhd): qemu-utils (qemu-img writes the reference).
packages=(swtpm swtpm-tools tpm2-tools protobuf-compiler gcc libssl-dev iproute2 ca-certificates
  cryptsetup-bin e2fsprogs mount gocryptfs fuse3 containerd runc containernetworking-plugins util-linux nftables netbase slirp4netns
  iptables make bzip2 libc6-dev bash curl bind9-dnsutils netcat-openbsd
  mmdebstrap erofs-utils systemd-boot-efi binutils dosfstools mtools systemd fdisk qemu-system-x86 ovmf dnsmasq-base
  pesign osslsigncode qemu-utils)

debs() {
  local missing=() p
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "install-deps: installing Debian packages: ${missing[*]}"
    if [ "$(id -u)" != 0 ]; then
      echo "install-deps: need root to install Debian packages (run as root or install: ${missing[*]})" >&2
      exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

# Go tools pinned by tools/devtools/go.mod. Rebuilt only when the pin changes.
devtools() {
  mkdir -p _output/bin
  local stamp=_output/bin/.devtools.sum want
  want=$(sha256sum tools/devtools/go.mod tools/devtools/go.sum | sha256sum | cut -d' ' -f1)
  if [ ! -x _output/bin/staticcheck ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "install-deps: building pinned Go tools (staticcheck, protoc-gen-go, protoc-gen-go-grpc, benchstat)"
    (cd tools/devtools && go build -o ../../_output/bin/ \
      honnef.co/go/tools/cmd/staticcheck \
      golang.org/x/perf/cmd/benchstat \
      google.golang.org/protobuf/cmd/protoc-gen-go \
      google.golang.org/grpc/cmd/protoc-gen-go-grpc)
    echo "$want" > "$stamp"
  fi
}

for part in ${*:-debs devtools}; do
  case $part in
  debs | devtools) "$part" ;;
  *) echo "install-deps: unknown part $part (debs, devtools)" >&2; exit 2 ;;
  esac
done
