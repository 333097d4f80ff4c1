package statedisk

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// LUKS2 is the state storage on kernels with dm-crypt and dm-integrity: a LUKS2 volume on
// Device with authenticated encryption (LUKS2Cipher, LUKS2Integrity), opened as the
// device-mapper device /dev/mapper/<Name>, with an ext4 filesystem that Unlock mounts at
// MountPoint. It drives the cryptsetup binary.
//
// The header on Device is untrusted: whoever controls the disk writes it, and cryptsetup
// does what it says. So no key ever meets the header on the device. Every operation that
// reads the header first copies it (header and keyslot area, cryptsetup luksHeaderBackup)
// into a private directory and checks the copy with ParseLUKS2Header; the operations that
// take a key then work on that checked copy: Unlock opens Device with --header <copy>, and
// Rekey changes the key in the copy and writes the copy back (luksHeaderRestore). A header
// changed on the disk after the check is never used with a key.
//
// Keys: the state key is the LUKS2 passphrase; the volume key is random (96 bytes: XTS and
// HMAC), made by luksFormat. Keys travel to cryptsetup on stdin, and the second key of a
// rekey through a pipe on file descriptor 3 (/dev/fd/3), never on a command line or in a
// file. The state key is a uniformly random 256-bit key, so argon2id runs at the smallest
// cost the header policy accepts (time 4, 32 MiB, one thread): stretching a random key buys
// nothing, and a cheap KDF keeps unlocking fast.
//
// Create formats with integrity and lets cryptsetup wipe the device (no
// --integrity-no-wipe): dm-integrity sectors that were never written carry no valid tag and
// fail every read, which breaks mkfs, blkid and the page cache's read-modify-write. The
// wipe writes the whole device once, so Create takes time proportional to its size. Create
// then makes the ext4 filesystem; Unlock only mounts, so a read error or a tampered disk can
// never make it format a disk that holds data.
//
// The initialized marker is a LUKS2 token of type MarkerTokenType in the header. Like the
// gocryptfs backend's marker file, it is untrusted: a removed marker makes the node treat
// the storage as a fresh node's; the key a forged marker makes the node ask for does not
// open storage it did not make.
//
// A LUKS2 is not safe for concurrent use.
type LUKS2 struct {
	// Device is the block device (or, for header operations, a file) that holds the volume.
	Device string
	// Name is the device-mapper name: Unlock opens the volume as /dev/mapper/<Name>.
	Name string
	// MountPoint is where Unlock mounts the filesystem.
	MountPoint string
	// MountFlags are the mount's flags (unix.MS_*), e.g. nosuid and nodev for storage whose
	// files a workload writes.
	MountFlags uintptr
	// Binary is the cryptsetup executable; default "cryptsetup" from PATH.
	Binary string
	// Mkfs is the ext4 mkfs executable; default "mkfs.ext4" from PATH.
	Mkfs string
	// HeaderDir is where the checked header copies are made, each in its own private
	// directory that is removed after the operation; default os.TempDir(). It must not be
	// writable by anyone who should not be able to change a header between check and use.
	HeaderDir string

	// sys is what LUKS2 drives on the machine; nil means the real one. Tests replace it.
	sys *luks2System
}

// luks2System is the boundary to the machine: commands, mounts, device-mapper nodes and
// the header check. Tests on kernels without device-mapper substitute parts of it
// (export_test.go).
type luks2System struct {
	run         func(cmd *exec.Cmd) error
	mount       func(source, target string, flags uintptr) error
	unmount     func(target string) error
	mounted     func(path string) (bool, error)
	mapperDir   string
	checkHeader func(r io.ReaderAt) (*LUKS2Header, error)
}

var realLUKS2System = luks2System{
	run: (*exec.Cmd).Run,
	mount: func(source, target string, flags uintptr) error {
		return unix.Mount(source, target, luks2Filesystem, flags, "")
	},
	unmount:     func(target string) error { return unix.Unmount(target, 0) },
	mounted:     isMountPoint,
	mapperDir:   "/dev/mapper",
	checkHeader: ParseLUKS2Header,
}

// luks2KDFArgs are the KDF arguments every command that writes a keyslot gets (luksFormat,
// luksChangeKey): the header policy's minimum argon2id cost (the keys are random). No
// keyslot cipher is given: with authenticated encryption (--integrity), cryptsetup 2.6.1
// refuses every explicit keyslot cipher ("keyslot is already authenticated",
// LUKS2_keyslot_cipher_incompatible returns -EINVAL with no message, exit code 1; seen at
// format and at luksChangeKey in a QEMU machine) and uses its default, LUKS2Cipher with a
// luks2AreaKeySize key. The header check pins that, so a cryptsetup whose default differs
// is refused rather than trusted.
var luks2KDFArgs = []string{
	"--hash", "sha256",
	"--pbkdf", "argon2id",
	"--pbkdf-force-iterations", strconv.Itoa(luks2MinArgonTime),
	"--pbkdf-memory", strconv.Itoa(luks2MinArgonMemory),
	"--pbkdf-parallel", "1",
}

// The key on stdin, exactly KeySize bytes (no newline handling: the key is binary).
var luks2KeyOnStdin = []string{"--key-file", "-", "--keyfile-size", strconv.Itoa(KeySize)}

const (
	// cryptsetup's exit code for "no permission (bad passphrase)" (cryptsetup(8), RETURN
	// CODES).
	cryptsetupWrongKey = 2
	// luksFormat's --key-size is the cipher's key (XTS: two AES-256 keys); for
	// --integrity it adds the HMAC key, which makes the LUKS2VolumeKeySize bytes.
	luks2CipherKeyBits = 512
	// luksFormat's name for LUKS2Integrity.
	luks2IntegrityOption = "hmac-sha256"
	luks2Filesystem      = "ext4"
)

func (l *LUKS2) system() *luks2System {
	if l.sys != nil {
		return l.sys
	}
	return &realLUKS2System
}

func (l *LUKS2) binary() string { return orDefault(l.Binary, "cryptsetup") }
func (l *LUKS2) mkfs() string   { return orDefault(l.Mkfs, "mkfs.ext4") }

// mappedDevice is the plaintext block device while the volume is open.
func (l *LUKS2) mappedDevice() (string, error) {
	if l.Name == "" || strings.ContainsRune(l.Name, '/') || l.Name == "." || l.Name == ".." {
		return "", fmt.Errorf("device-mapper name %q: want a non-empty name without '/'", l.Name)
	}
	return filepath.Join(l.system().mapperDir, l.Name), nil
}

// Exists reports whether Device carries a LUKS header: the magic of a primary header at its
// start, or of a secondary header at any offset LUKS2 allows (where cryptsetup looks for one
// when the primary is damaged). Only the magic counts, not whether the header is intact:
// a damaged header is storage that exists, which Create refuses to replace, not a blank
// device. A device that does not exist is an error, not storage to be created.
func (l *LUKS2) Exists() (bool, error) {
	f, err := os.Open(l.Device)
	if err != nil {
		return false, fmt.Errorf("state storage device: %w", err)
	}
	defer f.Close()
	magic := make([]byte, len(luks2Magic1))
	for off, want := int64(0), luks2Magic1; off <= luks2MaxHeaderSize; {
		switch _, err := f.ReadAt(magic, off); {
		case errors.Is(err, io.EOF):
			return false, nil
		case err != nil:
			return false, fmt.Errorf("state storage device: %w", err)
		case bytes.Equal(magic, want):
			return true, nil
		}
		if off == 0 {
			off, want = luks2MinHeaderSize, luks2Magic2
		} else {
			off *= 2
		}
	}
	return false, nil
}

// mustExist returns ErrNotCreated unless Device carries a LUKS header (see Exists).
func (l *LUKS2) mustExist() error {
	ok, err := l.Exists()
	if err == nil && !ok {
		err = ErrNotCreated
	}
	return err
}

// Create formats Device as a new, empty volume keyed with key and makes its filesystem.
// Storage left by an interrupted first boot (created, never initialized) is replaced: its
// key was random and lived only in the previous boot's memory. Initialized storage is
// never replaced, nor is a LUKS header that fails the check (whether it is initialized
// cannot be known).
func (l *LUKS2) Create(ctx context.Context, key []byte) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if initialized, err := l.Initialized(); err != nil {
		return err
	} else if initialized {
		return fmt.Errorf("state storage on %s is initialized: refusing to replace it", l.Device)
	}
	if err := l.Lock(ctx); err != nil {
		return err
	}
	args := []string{"luksFormat", "--type", "luks2", "--batch-mode",
		"--cipher", LUKS2Cipher, "--key-size", strconv.Itoa(luks2CipherKeyBits),
		"--integrity", luks2IntegrityOption,
		"--sector-size", strconv.Itoa(luks2SectorSize)}
	args = append(args, luks2KDFArgs...)
	args = append(args, luks2KeyOnStdin...)
	args = append(args, l.Device)
	// No timeout of our own: the integrity wipe takes time proportional to the device.
	if _, err := l.cryptsetup(ctx, 0, key, nil, args...); err != nil {
		return fmt.Errorf("creating state storage: %w", err)
	}
	if err := l.makeFilesystem(ctx, key); err != nil {
		return fmt.Errorf("creating state storage: %w", err)
	}
	return nil
}

// makeFilesystem opens the new volume through its checked header and puts an empty ext4 on
// it. Discards stay off: the volume does not allow them (dm-integrity).
func (l *LUKS2) makeFilesystem(ctx context.Context, key []byte) (err error) {
	mapped, err := l.mappedDevice()
	if err != nil {
		return err
	}
	header, _, done, err := l.checkedHeader(ctx)
	if err != nil {
		return err
	}
	defer done()
	if err := l.open(ctx, header, key); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, l.closeMapping(ctx)) }()
	if _, err := l.command(ctx, 0, nil, nil, l.mkfs(), "-q", "-E", "nodiscard", mapped); err != nil {
		return fmt.Errorf("making the filesystem: %w", err)
	}
	return nil
}

// UUID returns the UUID of the checked header.
func (l *LUKS2) UUID() (string, error) {
	_, h, done, err := l.checkedHeader(context.Background())
	if err != nil {
		return "", err
	}
	done()
	if !ValidUUID(h.UUID) {
		return "", fmt.Errorf("state storage id %q on %s is not a lower-case UUID", h.UUID, l.Device)
	}
	return h.UUID, nil
}

// Initialized reports whether the checked header carries the marker token. Storage that
// does not exist is not initialized.
func (l *LUKS2) Initialized() (bool, error) {
	if ok, err := l.Exists(); err != nil || !ok {
		return false, err
	}
	_, h, done, err := l.checkedHeader(context.Background())
	if err != nil {
		return false, err
	}
	done()
	return h.Initialized, nil
}

// MarkInitialized adds the marker token to the header (cryptsetup token import), unless
// the checked header has it already. No key is involved.
func (l *LUKS2) MarkInitialized() error {
	ctx := context.Background()
	_, h, done, err := l.checkedHeader(ctx)
	if err != nil {
		return err
	}
	done()
	if h.Initialized {
		return nil
	}
	token, err := json.Marshal(luks2Token{Type: MarkerTokenType, Keyslots: []string{}})
	if err != nil {
		return err
	}
	if _, err := l.cryptsetup(ctx, commandTimeout, token, nil, "token", "import", "--type", "luks2", "--json-file", "-", l.Device); err != nil {
		return fmt.Errorf("marking state storage initialized: %w", err)
	}
	return nil
}

// Rekey replaces oldKey with newKey in the checked copy of the header (luksChangeKey: the
// new keyslot wraps the same volume key), checks the result, and writes the copy back to
// Device (luksHeaderRestore). The data is not touched.
func (l *LUKS2) Rekey(ctx context.Context, oldKey, newKey []byte) error {
	if err := checkKey(oldKey); err != nil {
		return err
	}
	if err := checkKey(newKey); err != nil {
		return err
	}
	header, _, done, err := l.checkedHeader(ctx)
	if err != nil {
		return err
	}
	defer done()
	args := []string{"luksChangeKey", "--type", "luks2"}
	args = append(args, luks2KDFArgs...)
	args = append(args, luks2KeyOnStdin...)
	args = append(args, "--new-keyfile-size", strconv.Itoa(KeySize), header, "/dev/fd/3")
	if _, err := l.cryptsetup(ctx, commandTimeout, oldKey, newKey, args...); err != nil {
		return fmt.Errorf("rekeying state storage: %w", err)
	}
	// What goes back to the disk meets the policy too.
	if _, err := l.checkFile(header); err != nil {
		return fmt.Errorf("rekeying state storage: rekeyed header: %w", err)
	}
	if _, err := l.cryptsetup(ctx, commandTimeout, nil, nil, "luksHeaderRestore", "--type", "luks2", "--batch-mode", "--header-backup-file", header, l.Device); err != nil {
		return fmt.Errorf("rekeying state storage: writing the rekeyed header: %w", err)
	}
	return nil
}

// CheckKey asks cryptsetup whether key opens a keyslot of the checked header copy
// (open --test-passphrase): nothing is mapped, mounted or written. A wrong key is
// ErrWrongKey.
func (l *LUKS2) CheckKey(ctx context.Context, key []byte) error {
	if err := checkKey(key); err != nil {
		return err
	}
	header, _, done, err := l.checkedHeader(ctx)
	if err != nil {
		return err
	}
	defer done()
	args := []string{"open", "--type", "luks2", "--header", header, "--disable-external-tokens", "--test-passphrase"}
	args = append(args, luks2KeyOnStdin...)
	args = append(args, l.Device)
	if _, err := l.cryptsetup(ctx, commandTimeout, key, nil, args...); err != nil {
		if errors.Is(err, ErrWrongKey) {
			return err
		}
		return fmt.Errorf("checking the key of the state storage: %w", err)
	}
	return nil
}

// Unlock opens the volume with key through the checked header copy and mounts its
// filesystem at MountPoint.
func (l *LUKS2) Unlock(ctx context.Context, key []byte) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if l.MountPoint == "" {
		return errors.New("no mount point for the state storage")
	}
	mapped, err := l.mappedDevice()
	if err != nil {
		return err
	}
	if mounted, err := l.system().mounted(l.MountPoint); err != nil {
		return err
	} else if mounted {
		return fmt.Errorf("%s is already mounted", l.MountPoint)
	}
	if open, err := exists(mapped); err != nil {
		return err
	} else if open {
		return fmt.Errorf("%s is already open", mapped)
	}
	header, _, done, err := l.checkedHeader(ctx)
	if err != nil {
		return err
	}
	defer done()
	if err := os.MkdirAll(l.MountPoint, 0o700); err != nil {
		return fmt.Errorf("creating mount point: %w", err)
	}
	if err := l.open(ctx, header, key); err != nil {
		return fmt.Errorf("unlocking state storage: %w", err)
	}
	if err := l.system().mount(mapped, l.MountPoint, l.MountFlags); err != nil {
		if errors.Is(err, unix.EIO) {
			// dm-crypt checks each sector's tag and answers EIO for one that does not
			// match; the kernel log names the sector ("INTEGRITY AEAD ERROR").
			err = fmt.Errorf("%w (%w)", ErrSectorRefused, err)
		}
		err = fmt.Errorf("mounting %s at %s: %w", mapped, l.MountPoint, err)
		return errors.Join(err, l.closeMapping(ctx))
	}
	return nil
}

// Lock unmounts the filesystem and closes the volume, whichever of them is there.
func (l *LUKS2) Lock(ctx context.Context) error {
	if l.MountPoint != "" {
		mounted, err := l.system().mounted(l.MountPoint)
		if err != nil {
			return err
		}
		if mounted {
			if err := l.system().unmount(l.MountPoint); err != nil {
				return fmt.Errorf("unmounting %s: %w", l.MountPoint, err)
			}
		}
	}
	return l.closeMapping(ctx)
}

// open maps Device as Name with the header at header (a checked copy).
func (l *LUKS2) open(ctx context.Context, header string, key []byte) error {
	args := []string{"open", "--type", "luks2", "--header", header, "--disable-external-tokens"}
	args = append(args, luks2KeyOnStdin...)
	args = append(args, l.Device, l.Name)
	_, err := l.cryptsetup(ctx, commandTimeout, key, nil, args...)
	return err
}

// closeMapping closes the volume if it is open.
func (l *LUKS2) closeMapping(ctx context.Context) error {
	mapped, err := l.mappedDevice()
	if err != nil {
		return err
	}
	if open, err := exists(mapped); err != nil || !open {
		return err
	}
	if _, err := l.cryptsetup(ctx, commandTimeout, nil, nil, "close", l.Name); err != nil {
		return fmt.Errorf("closing %s: %w", mapped, err)
	}
	return nil
}

// checkedHeader copies Device's header and keyslot area into a new private directory in
// HeaderDir and checks the copy. It returns the copy's path, valid until done is called,
// and the checked header. ErrNotCreated if Device has no LUKS header.
func (l *LUKS2) checkedHeader(ctx context.Context) (path string, h *LUKS2Header, done func(), err error) {
	if err := l.mustExist(); err != nil {
		return "", nil, nil, err
	}
	dir, err := os.MkdirTemp(l.HeaderDir, "luks2-header-") // mode 0700
	if err != nil {
		return "", nil, nil, fmt.Errorf("directory for the header copy: %w", err)
	}
	done = func() { _ = os.RemoveAll(dir) }
	path = filepath.Join(dir, "header")
	if _, err := l.cryptsetup(ctx, commandTimeout, nil, nil, "luksHeaderBackup", "--type", "luks2", "--header-backup-file", path, l.Device); err != nil {
		done()
		err = fmt.Errorf("copying the LUKS2 header of %s: %w", l.Device, err)
		if exitCode(err) > 0 {
			// cryptsetup ran and cannot read what carries a LUKS magic (both copies
			// damaged or forged): storage this node will not use either.
			err = headerRefused{err}
		}
		return "", nil, nil, err
	}
	// cryptsetup makes the backup read-only; Rekey changes it.
	if err := os.Chmod(path, 0o600); err != nil {
		done()
		return "", nil, nil, err
	}
	if h, err = l.checkFile(path); err != nil {
		done()
		return "", nil, nil, fmt.Errorf("state storage on %s: %w", l.Device, headerRefused{err})
	}
	return path, h, done, nil
}

func (l *LUKS2) checkFile(path string) (*LUKS2Header, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return l.system().checkHeader(f)
}

// cryptsetup runs cryptsetup; exit code 2 (bad passphrase) becomes ErrWrongKey.
func (l *LUKS2) cryptsetup(ctx context.Context, timeout time.Duration, stdin, fd3 []byte, args ...string) ([]byte, error) {
	out, err := l.command(ctx, timeout, stdin, fd3, l.binary(), args...)
	if exitCode(err) == cryptsetupWrongKey && stdin != nil && (args[0] == "open" || args[0] == "luksChangeKey") {
		return nil, ErrWrongKey
	}
	return out, err
}

// command runs name with stdin on its standard input and fd3, if not nil, readable on its
// file descriptor 3 (a pipe: the data never touches a file). timeout 0: only ctx bounds it.
func (l *LUKS2) command(ctx context.Context, timeout time.Duration, stdin, fd3 []byte, name string, args ...string) ([]byte, error) {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	cmd := exec.CommandContext(ctx, name, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	if fd3 != nil {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		defer r.Close()
		// A key is far smaller than a pipe's buffer: written whole before the start.
		_, err = w.Write(fd3)
		if cerr := w.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, fmt.Errorf("pipe to %s: %w", name, err)
		}
		cmd.ExtraFiles = []*os.File{r}
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := l.system().run(cmd); err != nil {
		return nil, fmt.Errorf("%s %s: %w: %s", filepath.Base(name), args[0], err, bytes.TrimSpace(out.Bytes()))
	}
	return out.Bytes(), nil
}

// exitCode is the exit code of the program behind err: 0 for no error, -1 if err is not a
// program's exit.
func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode()
	}
	return -1
}
