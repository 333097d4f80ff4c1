#!/usr/bin/env bash
# Builds the node OS image (docs/vm-image.md) into _output/vm-image (VM_IMAGE_DEBUG=1:
# _output/vm-image-debug): disk.raw (GPT: ESP with the UKI, erofs root, its dm-verity hash
# tree), uki.efi and manifest.json, from the Debian bookworm packages pinned in
# hack/vm-image/packages.lock, reproducibly: the same inputs give the same root hash, UKI and
# disk, byte for byte.
#
#   hack/vm-image.sh          build (make vm-image)
#   hack/vm-image.sh lock     resolve hack/vm-image/packages.list against the mirror now and
#                             rewrite packages.lock (then build and commit both)
#
# Inputs besides the lock: the bootstrapper (_output/bin, make build), the Kubernetes binaries
# ($CONSTELLATION_KUBE_DIR or _output/kube, make kube) and container images
# ($CONSTELLATION_IMAGES_DIR or _output/images, make images) of $KUBERNETES (default: the
# default version). Caches in _output/vm-image-cache: the Debian tree per lock, the initrd per
# tree and initramfs configuration; a rebuild after a new bootstrapper reuses both.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
here=hack/vm-image
lock=$here/packages.lock
debug=${VM_IMAGE_DEBUG:-0}
suffix=
[ "$debug" != 1 ] || suffix=-debug
out=${VM_IMAGE_OUT:-_output/vm-image$suffix}
cache=${VM_IMAGE_CACHE:-_output/vm-image-cache}
kube=${CONSTELLATION_KUBE_DIR:-_output/kube}
images=${CONSTELLATION_IMAGES_DIR:-_output/images}
bootstrapper=${VM_IMAGE_BOOTSTRAPPER:-_output/bin/bootstrapper}
stub=/usr/lib/systemd/boot/efi/linuxx64.efi.stub
mirrors=(
  "deb http://deb.debian.org/debian bookworm main"
  "deb http://deb.debian.org/debian bookworm-updates main"
  "deb http://deb.debian.org/debian-security bookworm-security main"
)
# Fixed identifiers (docs/vm-image.md "Reproducibility"): the disk's GPT GUID and the ESP's
# are derived by systemd-repart from this seed; the partition UUIDs of root and root-verity
# are the root hash's halves; the verity salt and superblock UUID, the erofs UUID and the
# FAT volume ID are constants.
seed=6e6f6465-696d-4167-a500-636f6e737431
verity_salt=636f6e7374656c6c6174696f6e2d726f6f742d766572697479
verity_uuid=76657269-7479-4000-8000-636f6e737431
erofs_uuid=65726f66-7300-4000-8000-636f6e737431
fat_id=0x434f4e53

say() { echo "vm-image: [$(date +%T)] $*" >&2; }
die() { say "$*"; exit 1; }

need_tools() {
  local t missing=()
  for t in mmdebstrap mkfs.erofs veritysetup mkfs.vfat mcopy mmd objcopy systemd-repart sfdisk chroot unshare; do
    command -v "$t" >/dev/null || missing+=("$t")
  done
  [ -f "$stub" ] || missing+=("$stub")
  ((${#missing[@]} == 0)) || die "missing ${missing[*]}: run 'make debs' (hack/install-deps.sh)"
  [ "$(id -u)" = 0 ] || die "needs root (mmdebstrap --mode=root, chroot for the initrd)"
}

packages() { grep -v '^#' "$here/packages.list" | grep -v '^$'; }

# mmdebstrap_into DIR PACKAGE...: a Debian bookworm tree with the packages and their
# dependencies, no apt (--variant=essential installs with the host's apt), no docs, man pages
# or locales. INITRD=No: the kernel's postinst builds no initrd (ours is built below).
mmdebstrap_into() {
  local dir=$1 list
  shift
  list=$(IFS=,; echo "$*")
  INITRD=No nice mmdebstrap --mode=root --variant=essential --format=directory --include="$list" \
    --aptopt='Acquire::Languages "none"' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    bookworm "$dir" "${mirrors[@]}"
}

# installed DIR: "name version" of each package in the tree, sorted.
installed() { chroot "$1" dpkg-query -W -f='${Package} ${Version}\n' | LC_ALL=C sort; }

cmd_lock() {
  need_tools
  local tmp=$cache/lock-tree
  rm -rf "$tmp"
  mkdir -p "$cache"
  say "resolving $here/packages.list against the mirror (mmdebstrap, about a minute)"
  mapfile -t pkgs < <(packages)
  mmdebstrap_into "$tmp" "${pkgs[@]}"
  # The epoch moves only when the packages do: a lock refresh that changes nothing keeps the
  # image's bytes and so its measurements.
  local epoch
  epoch=$(date +%s)
  if [ -f "$lock" ] && diff -q <(grep -v '^#' "$lock") <(installed "$tmp") >/dev/null; then
    epoch=$(sed -n 's/^# source-date-epoch: //p' "$lock")
    say "no package changed; keeping source-date-epoch $epoch"
  fi
  {
    echo "# Exact versions of every package of the node OS image (hack/vm-image.sh lock wrote it"
    echo "# from hack/vm-image/packages.list; docs/vm-image.md \"Refreshing the lock\")."
    echo "# source-date-epoch: $epoch"
    installed "$tmp"
  } >"$lock"
  rm -rf "$tmp"
  say "wrote $lock ($(grep -vc '^#' "$lock") packages); build with make vm-image and commit it"
}

# lock_entries: "name=version" of each locked package.
lock_entries() { grep -v '^#' "$lock" | awk '{print $1 "=" $2}'; }

# check_mirror: every pinned version is still on the mirror (the host's apt lists, refreshed
# when older than a day), else a clear error saying how to refresh the lock.
check_mirror() {
  local missing
  missing=$(missing_pins)
  if [ -n "$missing" ]; then
    die "the mirror no longer has these pinned versions (a Debian point or security release replaced them):
$missing
refresh the lock: hack/vm-image.sh lock, then make vm-image, review the diff of $lock and commit it"
  fi
}

# missing_pins: the pinned "name version" lines the mirror no longer has (one apt-cache call
# on the host's lists, refreshed when older than a day).
missing_pins() {
  local fresh
  fresh=$(find /var/lib/apt/lists -maxdepth 1 -name '*_Packages*' -mmin -1440 | head -1)
  # The tiers that resolve a stale lock ask the mirror as it is now: a day-old list misses a
  # security update published since, which mmdebstrap's own fresh lists then lack the pin of.
  if [ "${VM_IMAGE_STALE_LOCK:-}" = resolve ] || [ -z "$fresh" ]; then
    apt-get update -q >/dev/null || true
  fi
  comm -23 <(grep -v '^#' "$lock" | LC_ALL=C sort -u) \
    <(apt-cache show $(lock_entries) 2>/dev/null | awk '/^Package:/ {p = $2} /^Version:/ {print p, $2}' | LC_ALL=C sort -u) |
    sed 's/^/  /'
}

# resolve_stale_lock: with VM_IMAGE_STALE_LOCK=resolve (the e2e tier sets it), a lock the
# mirror no longer serves is replaced, for this build only, by one resolved now into the
# cache: the tests boot an image of today's packages instead of failing on Debian's release
# schedule. The repository's lock is not touched, and the build says loudly that its image
# is not the pinned one. Without it, a stale lock fails the build (check_mirror).
resolve_stale_lock() {
  [ "${VM_IMAGE_STALE_LOCK:-}" = resolve ] || return 0
  local missing
  missing=$(missing_pins)
  [ -n "$missing" ] || return 0
  use_resolved_lock "the mirror no longer has these pinned versions:
$missing"
}

# use_resolved_lock WHY: switch this build to a lock resolved now into the cache (kept while
# the mirror still serves it), saying loudly why and that the image is not the pinned one.
use_resolved_lock() {
  say "WARNING: $1
building from packages resolved now ($cache/packages.lock), NOT from $here/packages.lock:
this image is not the pinned one. Refresh the lock: hack/vm-image.sh lock, then make
vm-image, and commit it."
  local resolved=$cache/packages.lock
  lock=$resolved
  if [ ! -f "$resolved" ] || [ -n "$(missing_pins)" ]; then
    rm -f "$resolved"
    cmd_lock >&2
  fi
}

# base_tree: the cached Debian tree of the lock ($cache/base-<key>), built when missing.
base_tree() {
  local key dir
  key=$( { cat "$lock" "$here/packages.list"; declare -f mmdebstrap_into; } | sha256sum | cut -c1-16)
  dir=$cache/base-$key
  if [ -f "$dir.done" ]; then
    echo "$dir"
    return
  fi
  check_mirror
  say "building the Debian tree (mmdebstrap; cold: about a minute, then cached as $dir)"
  rm -rf "$dir" "$cache"/base-*
  mapfile -t pins < <(lock_entries)
  # The tree must hold exactly the locked packages: a dependency that changed on the mirror
  # would otherwise slip in unpinned.
  if ! mmdebstrap_into "$dir" "${pins[@]}" >&2 ||
    ! diff <(grep -v '^#' "$lock") <(installed "$dir") >"$cache/lock.diff"; then
    # The mirror moved between the check and mmdebstrap's own lists: resolve once, if allowed.
    if [ "${VM_IMAGE_STALE_LOCK:-}" = resolve ] && [ "$lock" != "$cache/packages.lock" ]; then
      use_resolved_lock "mmdebstrap could not install the pinned versions"
      base_tree
      return
    fi
    die "the tree differs from $lock (< lock, > tree):
$(cat "$cache/lock.diff" 2>/dev/null)
refresh the lock: hack/vm-image.sh lock"
  fi
  touch "$dir.done"
  echo "$dir"
}

# in_chroot DIR CMD...: CMD in the tree with /proc, /sys and /dev, in a mount namespace of its
# own (nothing stays mounted).
in_chroot() {
  local dir=$1
  shift
  unshare --mount --propagation private -- sh -c '
    d=$1; shift
    mount -t proc proc "$d/proc" && mount -t sysfs sys "$d/sys" && mount --rbind /dev "$d/dev" &&
    exec chroot "$d" "$@"' sh "$dir" "$@"
}

# normalize_mtimes DIR: every file, link and directory dated SOURCE_DATE_EPOCH (mkfs.erofs -T
# dates only what it creates; what a step of this build touched would otherwise differ between
# a cold and a warm build).
normalize_mtimes() {
  find "$1" -xdev -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
}

cmd_build() {
  need_tools
  [ -f "$lock" ] || die "no $lock: run hack/vm-image.sh lock"
  resolve_stale_lock
  SOURCE_DATE_EPOCH=$(sed -n 's/^# source-date-epoch: //p' "$lock")
  [ -n "$SOURCE_DATE_EPOCH" ] || die "$lock names no source-date-epoch"
  export SOURCE_DATE_EPOCH TZ=UTC LC_ALL=C
  [ -x "$bootstrapper" ] || die "no bootstrapper at $bootstrapper: run make build"
  version=${KUBERNETES:-$(sed -n 's/^const Default = "\(v[0-9.]*\)"$/\1/p' internal/kubeversion/kubeversion.go)}
  [ -n "$version" ] || die "no Kubernetes version (set KUBERNETES)"
  local t0 base key work initrd kver
  t0=$(date +%s.%N)
  mkdir -p "$cache"
  base=$(base_tree)

  # The working tree: the Debian tree, our files, the node image directory.
  work=$cache/work
  rm -rf "$work"
  cp -a "$base" "$work"
  cp -a "$here/rootfs/." "$work/"
  if [ "$debug" = 1 ]; then cp -a "$here/debug/." "$work/"; fi
  kver=$(basename "$(ls -d "$work"/lib/modules/*)")

  # The initrd depends on the tree and the initramfs configuration only: cached per both.
  key=$( { echo "$base"; find "$here/rootfs/etc/initramfs-tools" -type f | LC_ALL=C sort | xargs cat; } | sha256sum | cut -c1-16)
  initrd=$cache/initrd-$key.img
  if [ ! -f "$initrd" ]; then
    say "building the initrd (mkinitramfs, MODULES=list)"
    rm -f "$cache"/initrd-*.img
    in_chroot "$work" env TMPDIR=/tmp mkinitramfs -o /initrd.img "$kver" >&2
    mv "$work/initrd.img" "$initrd"
  fi

  # Units: the bootstrapper on, containerd off (the bootstrapper runs it with the image's
  # containerd.toml), networkd on; no console login, no emergency shells, no userspace PCR
  # extensions (systemd-pcrphase* and, in later systemd, pcrmachine and pcrfs*).
  systemctl --root="$work" enable systemd-networkd.service systemd-networkd-wait-online.service constellation-bootstrapper.service >/dev/null 2>&1
  systemctl --root="$work" set-default multi-user.target >/dev/null 2>&1
  local masked=(containerd.service systemd-pcrphase.service systemd-pcrphase-initrd.service
    systemd-pcrphase-sysinit.service systemd-pcrmachine.service systemd-pcrfs-root.service systemd-pcrfs@.service
    systemd-firstboot.service e2scrub_all.timer e2scrub_reap.service)
  if [ "$debug" = 1 ]; then
    systemctl --root="$work" enable constellation-debug-shell.service >/dev/null 2>&1
  else
    masked+=(getty.target getty@.service serial-getty@.service console-getty.service container-getty@.service
      emergency.service emergency.target rescue.service rescue.target debug-shell.service)
  fi
  for u in "${masked[@]}"; do ln -sfn /dev/null "$work/etc/systemd/system/$u"; done

  # The node image directory and its container images, laid out by the code the sandbox uses.
  say "laying out the node image (Kubernetes $version)"
  go run ./hack/vm-image/layout -out "$work/usr/lib/constellation" -bootstrapper "$bootstrapper" \
    -kubernetes "$version" -kube-dir "$kube" -images-dir "$images"

  # Directories the kubelet would create on a writable root: the controller manager's
  # static pod mounts the flex-volume plugin directory (hostPath DirectoryOrCreate), which on
  # the read-only root must exist, empty, in the image.
  mkdir -p "$work/usr/libexec/kubernetes/kubelet-plugins/volume/exec"

  # What must not differ between builds or leak from the build host.
  rm -rf "$work"/boot/* "$work"/var/cache/* "$work"/var/log/* "$work"/var/lib/dpkg/*-old \
    "$work"/var/cache/ldconfig/aux-cache "$work"/etc/ssh/ssh_host_* "$work"/tmp/*
  : >"$work/etc/machine-id"
  rm -f "$work/var/lib/dbus/machine-id"
  echo node >"$work/etc/hostname"
  normalize_mtimes "$work"

  # The root filesystem (erofs, lz4hc, 4 KiB clusters) and its hash tree.
  say "making the root filesystem (erofs) and its dm-verity hash tree"
  local root=$cache/root.erofs hashes=$cache/root.verity roothash
  rm -f "$root" "$hashes"
  nice mkfs.erofs --quiet -zlz4hc -C4096 -T"$SOURCE_DATE_EPOCH" -U"$erofs_uuid" "$root" "$work"
  roothash=$(veritysetup format "$root" "$hashes" --data-block-size=4096 --hash-block-size=4096 \
    --salt="$verity_salt" --uuid="$verity_uuid" | sed -n 's/^Root hash:[[:space:]]*//p')
  [[ $roothash =~ ^[0-9a-f]{64}$ ]] || die "veritysetup printed no root hash"

  # The UKI: systemd-stub + os-release, the command line, the kernel and the initrd. The
  # command line is the same for every node (it is measured): the root hash, the serial
  # console, and panic=30 so that a boot that fails ends the VM (reboot; the provider sees it).
  local cmdline="console=ttyS0 root=/dev/mapper/root rootfstype=erofs ro roothash=$roothash panic=30"
  [ "$debug" != 1 ] || cmdline+=" constellation.debug"
  local uki=$cache/uki.efi
  make_uki "$uki" "$work/usr/lib/os-release" "$cmdline" "$base/boot/vmlinuz-$kver" "$initrd"

  # The ESP (FAT built in a file: the host kernel has no vfat) and the GPT disk.
  say "assembling the disk (systemd-repart)"
  local esp=$cache/esp.img disk=$cache/disk.raw
  rm -f "$esp" "$disk"
  local espkib=$(( ( $(stat -c %s "$uki") / 1048576 + 16 ) * 1024 ))
  ((espkib >= 33 * 1024)) || espkib=$((33 * 1024))
  mkfs.vfat --invariant -C -F 32 -S 512 -s 1 -i "$fat_id" -n ESP "$esp" "$espkib" >/dev/null
  MTOOLS_SKIP_CHECK=1 mmd -i "$esp" ::/EFI ::/EFI/BOOT
  MTOOLS_SKIP_CHECK=1 mcopy -m -i "$esp" "$uki" ::/EFI/BOOT/BOOTX64.EFI
  make_disk "$disk" "$esp" "$root" "$hashes" "$roothash"
  say "disk assembled"

  # Publish.
  rm -rf "$out.tmp"
  mkdir -p "$out.tmp"
  mv "$disk" "$out.tmp/disk.raw"
  cp "$uki" "$out.tmp/uki.efi"
  write_manifest "$out.tmp" "$roothash" "$cmdline" "$kver" "$initrd" "$base" "$version" "$root"
  rm -rf "$out"
  mv "$out.tmp" "$out"
  rm -rf "$work" "$esp"
  say "done in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s: $out (root hash $roothash)"
  ls -l "$out" >&2
}

# make_uki OUT OSREL CMDLINE KERNEL INITRD: objcopy adds the sections to bookworm's
# systemd-stub, each at the next 4 KiB-aligned address after the stub's own sections.
make_uki() {
  local out=$1 osrel=$2 cmdline=$3 kernel=$4 initrd=$5 dir end vma sec file
  dir=$(mktemp -d)
  printf '%s' "$cmdline" >"$dir/cmdline"
  # The end of the stub's last section (objdump -h: name, size, VMA; plus the image base).
  end=0
  while read -r idx _ size vma _; do
    [[ $idx =~ ^[0-9]+$ ]] || continue
    ((0x$vma + 0x$size <= end)) || end=$((0x$vma + 0x$size))
  done < <(objdump -h "$stub")
  vma=$(( (end + 0xfff) & ~0xfff ))
  local args=()
  for sec in .osrel:"$osrel" .cmdline:"$dir/cmdline" .linux:"$kernel" .initrd:"$initrd"; do
    file=${sec#*:}
    sec=${sec%%:*}
    args+=(--add-section "$sec=$file" --change-section-vma "$sec=$(printf '0x%x' "$vma")")
    vma=$(( (vma + $(stat -L -c %s "$file") + 0xfff) & ~0xfff ))
  done
  # -p keeps the stub's PE timestamp (zero): objcopy would otherwise stamp the build time.
  objcopy -p "${args[@]}" "$stub" "$out"
  touch -d "@$SOURCE_DATE_EPOCH" "$out"
  rm -rf "$dir"
}

# make_disk DISK ESP ROOT HASHES ROOTHASH: GPT with the three partitions, their contents
# copied block for block; the root and root-verity partition UUIDs are the root hash's halves.
make_disk() {
  local disk=$1 esp=$2 root=$3 hashes=$4 h=$5 defs
  defs=$(mktemp -d)
  uuid() { echo "${1:0:8}-${1:8:4}-${1:12:4}-${1:16:4}-${1:20:12}"; }
  cat >"$defs/00-esp.conf" <<EOF
[Partition]
Type=esp
Label=esp
CopyBlocks=$repo/$esp
EOF
  cat >"$defs/10-root.conf" <<EOF
[Partition]
Type=root
Label=root
UUID=$(uuid "${h:0:32}")
CopyBlocks=$repo/$root
ReadOnly=yes
EOF
  cat >"$defs/20-root-verity.conf" <<EOF
[Partition]
Type=root-verity
Label=root-verity
UUID=$(uuid "${h:32:32}")
CopyBlocks=$repo/$hashes
ReadOnly=yes
EOF
  systemd-repart --empty=create --size=auto --dry-run=no --seed="$seed" --definitions="$defs" "$disk" >"$defs/log" 2>&1 ||
    die "systemd-repart failed: $(cat "$defs/log")"
  rm -rf "$defs"
}

write_manifest() {
  local dir=$1 roothash=$2 cmdline=$3 kver=$4 initrd=$5 base=$6 version=$7 root=$8 pk
  pk=$(installed "$base" | awk '{printf "%s    \"%s\": \"%s\"", (NR > 1 ? ",\n" : ""), $1, $2}')
  cat >"$dir/manifest.json" <<EOF
{
  "roothash": "$roothash",
  "cmdline": "$cmdline",
  "kernel": "$kver",
  "ukiSHA256": "$(sha256sum "$dir/uki.efi" | cut -d' ' -f1)",
  "diskSHA256": "$(sha256sum "$dir/disk.raw" | cut -d' ' -f1)",
  "initrdSHA256": "$(sha256sum "$initrd" | cut -d' ' -f1)",
  "debug": $([ "$debug" = 1 ] && echo true || echo false),
  "kubernetesVersion": "$version",
  "sourceDateEpoch": $SOURCE_DATE_EPOCH,
  "sizes": {"disk": $(stat -c %s "$dir/disk.raw"), "uki": $(stat -c %s "$dir/uki.efi"), "initrd": $(stat -c %s "$initrd"), "root": $(stat -c %s "$root")},
  "packages": {
$pk
  }
}
EOF
}

case ${1:-build} in
build) cmd_build ;;
lock) cmd_lock ;;
*) die "unknown command $1 (build, lock)" ;;
esac
