package unlock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/openconstellation/constellation/internal/csidriver"
	"github.com/openconstellation/constellation/internal/statedisk"
)

// LUKS2 is the Unlocker of kernels with dm-crypt and dm-integrity (the QEMU provider's
// machines): the device is a disk the provider plugged into the machine, and the volume on
// it is LUKS2 with authenticated encryption and an ext4 file system, the same format and
// the same header policy as the machine's state disk (statedisk.LUKS2): 4096-byte sectors,
// aes-xts-plain64 with hmac-sha256 per sector, the header checked before any key meets it.
// A sector the host changed reads as an I/O error, never as data.
//
// The volume key is the LUKS2 passphrase (a random master key is made by luksFormat), so
// a disk of another volume, or one the host formatted itself, does not open: that is
// csidriver.ErrWrongKey and the disk stays as it was.
//
// A device is formatted only when it has no LUKS header and its first MiB is all zeros,
// which is what the platform creates; a volume whose format was interrupted (a header
// without the initialized marker) is formatted again, as its key is the volume's and
// nothing was ever written to it. Anything else is never formatted.
type LUKS2 struct {
	// WorkDir holds the checked header copies, each in a private directory removed after
	// use. It must be private to root (0700) and outside every pod's reach.
	WorkDir string
	// Cryptsetup and Mkfs are the executables; default from PATH.
	Cryptsetup, Mkfs string
}

var _ csidriver.Unlocker = (*LUKS2)(nil)

// ErrExpandUnsupported: cryptsetup 2.6 cannot grow a volume with integrity protection.
var ErrExpandUnsupported = errors.New("growing a volume with integrity protection is not supported on this platform (cryptsetup cannot resize dm-integrity); the volume keeps its size and data")

// plaintextMountFlags: the volume's file system is the pod's plaintext view; programs may run
// from it (as from any volume), set-user-ID bits and device files do not work on it.
const plaintextMountFlags = unix.MS_NOSUID | unix.MS_NODEV

// mappingName is the device-mapper name of the volume staged at target (stagingID).
func mappingName(target string) string { return "cvol-" + stagingID(target) }

func (l *LUKS2) volume(device, target string) *statedisk.LUKS2 {
	return &statedisk.LUKS2{
		Device: device, Name: mappingName(target), MountPoint: target, MountFlags: plaintextMountFlags,
		Binary: l.Cryptsetup, Mkfs: l.Mkfs, HeaderDir: l.WorkDir,
	}
}

// Stage opens the volume on device with key and mounts it at target.
func (l *LUKS2) Stage(ctx context.Context, device string, key []byte, target string) error {
	if l.WorkDir == "" {
		return errors.New("unlocking a volume: no work directory configured")
	}
	target = filepath.Clean(target)
	if done, err := mounted(target); err != nil {
		return err
	} else if done {
		return nil
	}
	if err := os.MkdirAll(l.WorkDir, 0o700); err != nil {
		return fmt.Errorf("unlocking a volume: %w", err)
	}
	vol := l.volume(device, target)
	// A mapping without its mount is what a Stage that stopped between the two left.
	if err := vol.Lock(ctx); err != nil {
		return fmt.Errorf("volume on %s: %w", device, err)
	}
	created, err := l.format(ctx, vol, device, key)
	if err != nil {
		return err
	}
	if err := vol.Unlock(ctx, key); err != nil {
		if errors.Is(err, statedisk.ErrWrongKey) {
			return fmt.Errorf("volume on %s: %w (no keyslot of its LUKS2 header takes it); the volume was not changed", device, csidriver.ErrWrongKey)
		}
		return fmt.Errorf("volume on %s: %w", device, err)
	}
	if created {
		// As the local unlocker does: a new volume's root is writable by the workload's
		// user, whichever it is.
		if err := os.Chmod(target, 0o777); err != nil {
			return fmt.Errorf("volume on %s: making its root writable: %w", device, err)
		}
	}
	return nil
}

// format formats a device that holds zeros, or a volume whose format was interrupted, and
// reports whether it did. A header that fails the check is never replaced.
func (l *LUKS2) format(ctx context.Context, vol *statedisk.LUKS2, device string, key []byte) (bool, error) {
	exists, err := vol.Exists()
	if err != nil {
		return false, fmt.Errorf("volume on %s: %w", device, err)
	}
	if exists {
		initialized, err := vol.Initialized()
		if err != nil {
			return false, fmt.Errorf("volume on %s: %w; the volume was not changed", device, err)
		}
		if initialized {
			return false, nil
		}
	} else if zeros, err := allZeros(device, probeBytes); err != nil {
		return false, err
	} else if !zeros {
		return false, fmt.Errorf("volume on %s holds neither a LUKS2 volume nor zeros: it is not formatted, and left as it is", device)
	}
	if err := vol.Create(ctx, key); err != nil {
		return false, fmt.Errorf("volume on %s: %w", device, err)
	}
	if err := vol.MarkInitialized(); err != nil {
		return false, fmt.Errorf("volume on %s: %w", device, err)
	}
	return true, nil
}

// Unstage unmounts target and closes the volume's mapping. Neither there: nothing to do.
func (l *LUKS2) Unstage(ctx context.Context, target string) error {
	target = filepath.Clean(target)
	vol := l.volume("", target)
	if err := vol.Lock(ctx); err != nil {
		return fmt.Errorf("closing the volume at %s: %w", target, err)
	}
	return nil
}

// Expand is refused: see ErrExpandUnsupported.
func (l *LUKS2) Expand(context.Context, string) error { return ErrExpandUnsupported }

// Stats reports the file system's use at target.
func (l *LUKS2) Stats(_ context.Context, target string) (csidriver.Stats, error) {
	return statsOf(target)
}

// statsOf reports the use of the file system mounted at target.
func statsOf(target string) (csidriver.Stats, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(target, &st); err != nil {
		return csidriver.Stats{}, fmt.Errorf("statfs %s: %w", target, err)
	}
	bsize := st.Bsize
	return csidriver.Stats{
		TotalBytes:     int64(st.Blocks) * bsize,
		AvailableBytes: int64(st.Bavail) * bsize,
		UsedBytes:      int64(st.Blocks-st.Bfree) * bsize,
		TotalInodes:    int64(st.Files),
		FreeInodes:     int64(st.Ffree),
		UsedInodes:     int64(st.Files - st.Ffree),
	}, nil
}
