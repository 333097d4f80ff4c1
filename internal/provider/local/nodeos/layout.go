package nodeos

// The node's file system, and why no overlay lies on the state storage.
//
// The state storage is gocryptfs, a FUSE file system built on go-fuse. Debian's gocryptfs 2.3
// (go-fuse 2.1) loses track of a live file now and then: a file created with an inode number
// the backing file system (ext4 reuses them at once) freed a moment before gets a new go-fuse
// node, and when the kernel's FORGET of the previous owner of that number arrives late, it
// drops the new node from go-fuse's table too. From then on every LOOKUP of the live file
// answers with a fresh node ID, not the one the kernel holds, so the kernel's revalidation of
// that name fails. A plain FUSE mount recovers: the kernel drops its dentry and looks the name
// up again. An overlayfs with its upper layer there does not: it reports the failed
// revalidation as ESTALE and keeps its own dentry, so every later operation on that name fails
// for good (a kubelet that renames its dra_manager_state checkpoint into place, as it does for
// every pod, then starts no pod again). TestKubeletLoadOnState reproduces it in seconds.
//
// Even on a plain FUSE mount the failed revalidation matters to what is tied to the kernel's
// dentry or inode: a mount on such a directory is detached (d_invalidate), a unix socket bound
// there can no longer be reached by its path. So:
//
//   - no overlay on the storage: the directories that persist (PersistentDirs) are bind mounts
//     of directories of the storage, mounted on directories of the tmpfs overlays; the files
//     that persist alone (PersistentFiles) are symbolic links into the storage;
//   - nothing is mounted on a directory of the storage and no socket is bound in it: the rest
//     of /etc and /var/lib, the kubelet's root directory with its pod volume mount points and
//     sockets included, is volatile, in overlays whose upper layers are on the node's tmpfs.
//     The kubelet needs that anyway: its root directory must be on a file system cAdvisor
//     knows (ext*, xfs, btrfs, overlay, tmpfs, ...), or its container manager does not start
//     ("failed to get rootfs info ... could not find device in cached partitions map").

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/openconstellation/constellation/internal/registries"
	"github.com/openconstellation/constellation/internal/volumes"
)

// PersistentDir is a directory of the node that outlives a boot: a bind mount of the directory
// of the same path in the unlocked state storage, so its contents reach the disk only
// encrypted.
type PersistentDir struct {
	Path string
	// Mode of the directory when the storage does not have it yet.
	Mode os.FileMode
}

// PersistentDirs are what the node must find again after a reboot: the reboot path unlocks the
// storage and restarts the kubelet, and runs neither kubeadm nor anything else that would
// write them again.
var PersistentDirs = []PersistentDir{
	// PKI, kubeconfigs, static pod manifests, the removed-node authorizer's configuration.
	{Path: "/etc/kubernetes", Mode: 0o755},
	// The kubelet's client and serving certificates.
	{Path: kubeletRoot + "/pki", Mode: 0o700},
	// etcd's data (control planes; etcd wants 0700).
	{Path: "/var/lib/etcd", Mode: 0o700},
	// The default StorageClass's volumes (internal/volumes): the provisioner's helper pods
	// make one directory each below it, and pods bind-mount those.
	{Path: volumes.Dir, Mode: 0o755},
	// containerd's registry hosts (internal/registries): the cluster's registry mirrors as the
	// last init, join or rejoin ticket delivered them, kept for a boot that gets no ticket (a
	// recovered control plane).
	{Path: registries.HostsDir, Mode: 0o755},
}

// PersistentFiles are the files kubeadm writes into the kubelet's volatile root directory at
// init and join, and the kubelet reads at every start: symbolic links to files of the storage
// (kubeadm writes them with os.WriteFile, which follows the link).
var PersistentFiles = []string{
	kubeletRoot + "/config.yaml",
	kubeletRoot + "/kubeadm-flags.env",
	kubeletRoot + "/instance-config.yaml",
}

const kubeletRoot = "/var/lib/kubelet"

// volatileOverlays are overlaid at boot with upper layers on the tmpfs.
var volatileOverlays = []string{"/etc", "/var/lib"}

// layout is where the node's file system is put together: below root ("/" on a node), with
// volatile, a directory on a tmpfs, for what is not to outlive the boot. Tests put both below
// temporary directories.
type layout struct {
	root     string
	volatile string
}

var nodeLayout = layout{root: "/", volatile: RunDir + "/volatile"}

func (l layout) path(p ...string) string { return filepath.Join(append([]string{l.root}, p...)...) }

// upperOf returns where the node's own writes to path are kept when path is below a volatile
// overlay (the overlay's upper layer), or "" when it is not.
func (l layout) upperOf(path string) string {
	for _, target := range volatileOverlays {
		rel, err := filepath.Rel(target, path)
		if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
			continue
		}
		return filepath.Join(l.volatile, strings.ReplaceAll(strings.Trim(target, "/"), "/", "-"), "upper", rel)
	}
	return ""
}

// mountVolatile overlays /etc and /var/lib with upper layers on the tmpfs.
func (l layout) mountVolatile() error {
	for _, target := range volatileOverlays {
		dir := filepath.Join(l.volatile, strings.ReplaceAll(strings.Trim(target, "/"), "/", "-"))
		if err := overlay(l.path(target), dir, false); err != nil {
			return err
		}
	}
	return nil
}

// mountState binds PersistentDirs and links PersistentFiles from the unlocked storage mounted
// at dir.
func (l layout) mountState(dir string) error {
	// Earlier images kept the upper layers of /etc and /var/lib overlays in the storage. Such
	// a node's state is not where this image looks for it: refuse rather than come up as an
	// empty node.
	for _, old := range []string{"etc/upper", "var-lib/upper"} {
		if _, err := os.Lstat(filepath.Join(dir, old)); err == nil {
			return fmt.Errorf("the state storage has the layout of an earlier node image (overlay layer %s): this image does not read it", old)
		}
	}
	for _, d := range PersistentDirs {
		if err := os.MkdirAll(filepath.Join(dir, d.Path), d.Mode); err != nil {
			return fmt.Errorf("creating %s in the state storage: %w", d.Path, err)
		}
	}
	for _, f := range PersistentFiles {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(f)), 0o750); err != nil {
			return fmt.Errorf("creating %s in the state storage: %w", filepath.Dir(f), err)
		}
	}
	// The kubelet bind-mounts its root directory onto itself, without what is mounted below
	// it, unless that directory is on a shared mount. So it is a shared mount of its own
	// before the kubelet starts, with the persistent directories below it.
	root := l.path(kubeletRoot)
	if err := os.MkdirAll(root, 0o750); err != nil {
		return fmt.Errorf("creating %s: %w", kubeletRoot, err)
	}
	if err := bindDir(root, root); err != nil {
		return err
	}
	for _, d := range PersistentDirs {
		target := l.path(d.Path)
		if err := os.MkdirAll(target, d.Mode); err != nil {
			return fmt.Errorf("creating %s: %w", d.Path, err)
		}
		// Anything the node wrote there before the unlock would be hidden by the bind mount and
		// lost at the next boot: a bug of the node's flow, not something to paper over. What
		// the host's own directory holds there (the overlay's lower layer: a host with its own
		// containerd or kubeadm) is not the node's, and the bind mount hides it from the node.
		written := target
		if upper := l.upperOf(d.Path); upper != "" {
			written = upper
		}
		entries, err := os.ReadDir(written)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("reading %s: %w", d.Path, err)
		}
		if len(entries) > 0 {
			return fmt.Errorf("%s has %s before the state storage is mounted there", d.Path, entries[0].Name())
		}
		if err := bindDir(filepath.Join(dir, d.Path), target); err != nil {
			return err
		}
	}
	for _, f := range PersistentFiles {
		if _, err := os.Lstat(l.path(f)); err == nil {
			return fmt.Errorf("%s was written before the state storage is mounted", f)
		}
		if err := os.Symlink(filepath.Join(dir, f), l.path(f)); err != nil {
			return fmt.Errorf("linking %s to the state storage: %w", f, err)
		}
	}
	if err := syscall.Mount("", root, "", syscall.MS_SHARED|syscall.MS_REC, ""); err != nil {
		return fmt.Errorf("making %s a shared mount: %w", kubeletRoot, err)
	}
	return nil
}

func bindDir(src, dst string) error {
	if err := syscall.Mount(src, dst, "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mounting %s on %s: %w", src, dst, err)
	}
	return nil
}
