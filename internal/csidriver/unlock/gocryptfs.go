// Package unlock holds the node platforms' csidriver.Unlocker implementations: how a volume's
// device is opened with its key and mounted. What the host sees of a volume:
// docs/volumes.md "Local unlocker: what the host sees".
package unlock

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/openconstellation/constellation/internal/csidriver"
	"github.com/openconstellation/constellation/internal/statedisk"
)

// Gocryptfs is the Unlocker of kernels without device-mapper (the local provider's nodes).
// The device is the volume's backing file (or a block device): an ext4 file system, mounted
// through a loop device under WorkDir, holds a gocryptfs tree (statedisk.Gocryptfs), whose
// plaintext view, unlocked with the volume key, is the staged volume.
//
// ext4 gives the volume its size (the file system is as large as the device, so a full
// volume is ENOSPC, not a full host) and grows with it (resize2fs). gocryptfs gives
// confidentiality and integrity of each file's content and name (AES-GCM per 4 KiB block).
//
// A device is formatted only when its first MiB is all zeros, which is what the platform
// creates. Anything else is never formatted: a key that does not open the tree is
// csidriver.ErrWrongKey and the device stays as it was.
type Gocryptfs struct {
	// WorkDir holds the ext4 mounts, one directory per staged volume named after its staging
	// path. It should be private to root (0700) and outside every pod's reach.
	WorkDir string
	// Gocryptfs and Fusermount are the executables statedisk.Gocryptfs runs; default from PATH.
	Gocryptfs, Fusermount string
}

var _ csidriver.Unlocker = (*Gocryptfs)(nil)

const (
	// probeBytes is how much of a device must be zeros for it to count as never formatted:
	// ext4's superblock is at 1 KiB, and every other file system's signature within the
	// first MiB, so a used device never reads as zeros here.
	probeBytes = 1 << 20
	// commandTimeout bounds one mkfs, mount, losetup or resize2fs run.
	commandTimeout = 5 * time.Minute
	// busyTimeout bounds the wait for the gocryptfs daemon to let go of the ext4 file system.
	busyTimeout = 10 * time.Second
	// mountFlags keep the ext4 file system of the ciphertext from being a way into the node.
	mountFlags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
)

// backingDir is where the ext4 file system of the volume staged at target is mounted.
func (g *Gocryptfs) backingDir(target string) string {
	return filepath.Join(g.WorkDir, stagingID(target))
}

// stagingID names what an unlocker keeps for the volume staged at target (a work folder, a
// device-mapper name): a function of the staging path, so that Unstage finds what Stage made
// without any record.
func stagingID(target string) string {
	sum := sha256.Sum256([]byte(filepath.Clean(target)))
	return hex.EncodeToString(sum[:16])
}

func (g *Gocryptfs) tree(backing, target string) *statedisk.Gocryptfs {
	return &statedisk.Gocryptfs{Dir: backing, MountPoint: target, Binary: g.Gocryptfs, Fusermount: g.Fusermount}
}

// Stage mounts the volume on device at target, unlocked with key.
func (g *Gocryptfs) Stage(ctx context.Context, device string, key []byte, target string) (retErr error) {
	if g.WorkDir == "" {
		return errors.New("unlocking a volume: no work directory configured")
	}
	target = filepath.Clean(target)
	if done, err := mounted(target); err != nil {
		return err
	} else if done {
		return nil
	}
	backing := g.backingDir(target)
	// Whatever fails below leaves nothing mounted: the next try starts from the device.
	defer func() {
		if retErr != nil {
			retErr = errors.Join(retErr, g.unmountBacking(backing))
		}
	}()
	if err := g.mountBacking(ctx, device, backing); err != nil {
		return err
	}
	tree := g.tree(backing, target)
	created, err := tree.Exists()
	if err != nil {
		return fmt.Errorf("volume on %s: %w", device, err)
	}
	if !created {
		// A new volume (formatted just now, or formatted by a try that ended before
		// this step). A tree once initialized and now without its gocryptfs.conf has
		// lost its master key; it is not replaced.
		if initialized, err := tree.Initialized(); err != nil {
			return fmt.Errorf("volume on %s: %w", device, err)
		} else if initialized {
			return fmt.Errorf("volume on %s: its gocryptfs.conf is missing: the volume's data cannot be decrypted, and it is left as it is", device)
		}
		if err := tree.Create(ctx, key); err != nil {
			return fmt.Errorf("volume on %s: creating the encrypted tree: %w", device, err)
		}
		if err := tree.MarkInitialized(); err != nil {
			return fmt.Errorf("volume on %s: %w", device, err)
		}
	}
	if err := tree.Unlock(ctx, key); err != nil {
		if errors.Is(err, statedisk.ErrWrongKey) {
			return fmt.Errorf("volume on %s: %w (gocryptfs refused the key); the volume was not changed", device, csidriver.ErrWrongKey)
		}
		return fmt.Errorf("volume on %s: %w", device, err)
	}
	if !created {
		// Every user may write a new volume's root, as local-path-provisioner makes its
		// directories: the workload's user is not known (a pod's fsGroup, when it sets one,
		// is applied by the kubelet: fsGroupPolicy File). Only a new volume: a mode its user
		// set later is kept.
		if err := os.Chmod(target, 0o777); err != nil {
			return fmt.Errorf("volume on %s: making its root writable: %w", device, err)
		}
	}
	return nil
}

// mountBacking mounts device's ext4 file system at backing, formatting a device of zeros
// first. Mounted already (a try that stopped later): nothing to do.
func (g *Gocryptfs) mountBacking(ctx context.Context, device, backing string) error {
	if done, err := mounted(backing); err != nil || done {
		return err
	}
	st, err := os.Stat(device)
	if err != nil {
		return fmt.Errorf("volume device: %w", err)
	}
	isFile := st.Mode().IsRegular()
	if !isFile && st.Mode().Type() != os.ModeDevice {
		return fmt.Errorf("volume device %s is neither a file nor a block device", device)
	}
	fresh, err := allZeros(device, probeBytes)
	if err != nil {
		return err
	}
	if fresh {
		// -m 0: no blocks reserved for root; the volume's size is all the pod's.
		// -E nodiscard: a fresh device is zeros already.
		if _, err := run(ctx, "mkfs.ext4", "-q", "-F", "-m", "0", "-E", "nodiscard", device); err != nil {
			return fmt.Errorf("formatting the new volume %s: %w", device, err)
		}
	}
	if !fresh && isFile {
		if err := growOffline(ctx, device, st.Size()); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(backing, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", backing, err)
	}
	source := device
	if isFile {
		// losetup --show prints the device; mount then holds it. Detaching it right away
		// only marks it autoclear (the mount holds it open), so the kernel releases it on
		// unmount and no loop device outlives the mount, even if this process dies.
		out, err := run(ctx, "losetup", "--find", "--show", device)
		if err != nil {
			return fmt.Errorf("attaching %s to a loop device: %w", device, err)
		}
		source = strings.TrimSpace(string(out))
		if !strings.HasPrefix(source, "/dev/loop") {
			return fmt.Errorf("losetup printed %q, not a loop device", source)
		}
		defer func() { _, _ = run(context.WithoutCancel(ctx), "losetup", "-d", source) }()
	}
	if err := unix.Mount(source, backing, "ext4", mountFlags, ""); err != nil {
		return fmt.Errorf("mounting the volume's ext4 file system (%s on %s): %w", device, source, err)
	}
	return nil
}

// growOffline grows the ext4 file system in the volume file device to the file's size when the
// platform grew the file (ControllerExpandVolume) since the file system was last sized: before
// it is mounted, so that an expansion needs no online resize (which the kernel allows only
// with CAP_SYS_RESOURCE, a capability the local provider's nodes may lack). e2fsck first, as
// resize2fs asks for an unmounted file system; its exit codes 0 and 1 mean clean or fixed.
func growOffline(ctx context.Context, device string, size int64) error {
	out, err := run(ctx, "dumpe2fs", "-h", device)
	if err != nil {
		// Not an ext4 file system dumpe2fs can read: nothing to grow; the mount that follows
		// refuses it and names it.
		return nil
	}
	var blocks, blockSize int64
	for _, line := range strings.Split(string(out), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch k {
		case "Block count":
			blocks, err = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		case "Block size":
			blockSize, err = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
		if err != nil {
			return fmt.Errorf("reading the volume's file system size: %q: %w", line, err)
		}
	}
	if blocks <= 0 || blockSize <= 0 {
		return fmt.Errorf("reading the volume's file system size: dumpe2fs named no block count and size")
	}
	if blocks*blockSize+blockSize > size {
		return nil // sized already (within a block)
	}
	ctxCheck, cancel := context.WithTimeout(ctx, commandTimeout)
	defer cancel()
	check := exec.CommandContext(ctxCheck, "e2fsck", "-f", "-p", device)
	if out, err := check.CombinedOutput(); err != nil {
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() > 1 {
			return fmt.Errorf("checking the volume's file system before growing it: %w: %s", err, bytes.TrimSpace(out))
		}
	}
	if _, err := run(ctx, "resize2fs", device); err != nil {
		return fmt.Errorf("growing the volume's file system to %d bytes: %w", size, err)
	}
	return nil
}

// allZeros reports whether the first n bytes of path (all of it, if shorter) are zeros.
func allZeros(path string, n int64) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, fmt.Errorf("reading the volume device: %w", err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	r := io.LimitReader(f, n)
	for {
		k, err := r.Read(buf)
		for _, b := range buf[:k] {
			if b != 0 {
				return false, nil
			}
		}
		if errors.Is(err, io.EOF) {
			return true, nil
		}
		if err != nil {
			return false, fmt.Errorf("reading the volume device %s: %w", path, err)
		}
	}
}

// Unstage unmounts the plaintext view at target, then the ext4 file system (which releases
// its loop device).
func (g *Gocryptfs) Unstage(ctx context.Context, target string) error {
	target = filepath.Clean(target)
	backing := g.backingDir(target)
	if err := g.tree(backing, target).Lock(ctx); err != nil {
		return fmt.Errorf("locking the volume at %s: %w", target, err)
	}
	return g.unmountBacking(backing)
}

// unmountBacking unmounts the ext4 file system at backing, if mounted, and removes the
// directory.
func (g *Gocryptfs) unmountBacking(backing string) error {
	loop := ""
	if entry, err := mountAt(backing); err != nil {
		return err
	} else if entry != nil {
		loop = entry.Source
		if err := unmountBusy(backing); err != nil {
			return fmt.Errorf("unmounting the volume's ext4 file system at %s: %w", backing, err)
		}
	}
	// The loop device is autoclear and gone with the mount; one still there (a kernel
	// without autoclear on a busy device) is detached here.
	if strings.HasPrefix(loop, "/dev/loop") {
		if _, err := os.Stat(filepath.Join("/sys/block", filepath.Base(loop), "loop")); err == nil {
			_, _ = run(context.Background(), "losetup", "-d", loop)
		}
	}
	if err := os.Remove(backing); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing %s: %w", backing, err)
	}
	return nil
}

// unmountBusy unmounts path, retrying while it is busy: after fusermount -u returns, the
// gocryptfs daemon still holds its files on the ext4 file system until it has exited.
func unmountBusy(path string) error {
	deadline := time.Now().Add(busyTimeout)
	for {
		err := unix.Unmount(path, 0)
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Expand grows the ext4 file system under the volume mounted at target (the staging path or
// a published one) to its device's size: the loop device learns the file's new size
// (losetup -c), then resize2fs grows the mounted file system.
func (g *Gocryptfs) Expand(ctx context.Context, target string) error {
	backing, err := g.backingOf(target)
	if err != nil {
		return err
	}
	entry, err := mountAt(backing)
	if err != nil {
		return err
	}
	if entry == nil {
		return fmt.Errorf("expanding the volume at %s: its ext4 file system is not mounted", target)
	}
	dev := entry.Source
	if strings.HasPrefix(dev, "/dev/loop") {
		if _, err := run(ctx, "losetup", "-c", dev); err != nil {
			return fmt.Errorf("expanding the volume at %s: %w", target, err)
		}
	}
	if _, err := run(ctx, "resize2fs", dev); err != nil {
		return fmt.Errorf("expanding the volume at %s: %w", target, err)
	}
	return nil
}

// backingOf finds the ext4 mount under the gocryptfs mount at target: gocryptfs names its
// mount after its cipher directory (<backing>/cipher), and a bind mount of it keeps the name.
// Only a directory of WorkDir is accepted.
func (g *Gocryptfs) backingOf(target string) (string, error) {
	entry, err := mountAt(filepath.Clean(target))
	if err != nil {
		return "", err
	}
	if entry == nil {
		return "", fmt.Errorf("no volume is mounted at %s", target)
	}
	backing := filepath.Dir(entry.Source)
	if entry.FSType != "fuse.gocryptfs" || filepath.Base(entry.Source) != "cipher" || filepath.Dir(backing) != filepath.Clean(g.WorkDir) {
		return "", fmt.Errorf("%s is not a volume of this driver (mounted from %s, type %s)", target, entry.Source, entry.FSType)
	}
	return backing, nil
}

// Stats reports the file system's use at target: gocryptfs reports its ext4 file system's.
func (g *Gocryptfs) Stats(_ context.Context, target string) (csidriver.Stats, error) {
	return statsOf(target)
}

// mounted reports whether path is a mount point; a path that does not exist is not.
func mounted(path string) (bool, error) {
	ok, err := mountinfo.Mounted(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return false, nil
	case errors.Is(err, unix.ENOTCONN):
		return true, nil // a FUSE mount whose daemon died
	case err != nil:
		return false, fmt.Errorf("checking whether %s is mounted: %w", path, err)
	}
	return ok, nil
}

// mountAt returns the topmost mount at path (the last in the mount table), or nil.
func mountAt(path string) (*mountinfo.Info, error) {
	mounts, err := mountinfo.GetMounts(func(m *mountinfo.Info) (skip, stop bool) {
		return m.Mountpoint != path, false
	})
	if err != nil {
		return nil, fmt.Errorf("reading the mount table: %w", err)
	}
	if len(mounts) == 0 {
		return nil, nil
	}
	return mounts[len(mounts)-1], nil
}

// run runs a tool and returns its standard output; a failure names the tool and what it said.
func run(ctx context.Context, name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, commandTimeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return stdout.Bytes(), nil
}
