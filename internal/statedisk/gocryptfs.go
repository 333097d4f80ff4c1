package statedisk

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sys/unix"

	"github.com/openconstellation/constellation/internal/fileutil"
)

// Gocryptfs is the state storage on kernels without device-mapper: a gocryptfs filesystem
// (Debian's gocryptfs over FUSE) whose encrypted tree lives in Dir/cipher and whose
// plaintext view is mounted at MountPoint.
//
// Keys: gocryptfs encrypts the files with a random master key that it wraps with a
// password (scrypt, then AES-GCM, in gocryptfs.conf). The state key, hex-encoded, is that
// password, so Rekey is gocryptfs -passwd: it re-wraps the master key and rewrites nothing
// else, as changing a LUKS keyslot does. The password is a uniformly random 256-bit key,
// not something a person chose, so scrypt's stretching buys nothing: the cost parameter is
// gocryptfs' minimum (logN 10) to keep unlocking fast. Keys travel to gocryptfs on stdin,
// never on a command line or in a file.
//
// Beside the cipher tree, Dir holds two small files in the clear: "uuid" (the storage's id,
// the key id the join service derives the key for) and "initialized" (the marker). Both
// are untrusted: a changed uuid makes the released key wrong, so the unlock fails; a
// removed marker makes the node treat the storage as a fresh node's, whose random key was
// lost with the previous boot anyway.
//
// Access: the plaintext view is mounted -allow_other, so that the kernel checks every
// access by the files' permissions (FUSE's default_permissions) instead of refusing every
// user but the mounting one (root): a pod of another user reaches its volume there
// (internal/volumes), as on any other file system, and root without capabilities only
// what it owns.
type Gocryptfs struct {
	// Dir holds the cipher tree and the storage's metadata.
	Dir string
	// MountPoint is where the plaintext view appears.
	MountPoint string
	// Binary is the gocryptfs executable; default "gocryptfs" from PATH.
	Binary string
	// Fusermount is the FUSE unmount helper; default "fusermount3" from PATH.
	Fusermount string
}

const (
	gocryptfsScryptN = "10"
	// gocryptfs exit code for a wrong password (exitcodes.PasswordIncorrect).
	gocryptfsWrongPassword = 12
	// commandTimeout bounds one gocryptfs or fusermount run.
	commandTimeout = 30 * time.Second
)

func (g *Gocryptfs) cipherDir() string  { return filepath.Join(g.Dir, "cipher") }
func (g *Gocryptfs) uuidFile() string   { return filepath.Join(g.Dir, "uuid") }
func (g *Gocryptfs) markerFile() string { return filepath.Join(g.Dir, "initialized") }
func (g *Gocryptfs) confFile() string   { return filepath.Join(g.cipherDir(), "gocryptfs.conf") }
func (g *Gocryptfs) binary() string     { return orDefault(g.Binary, "gocryptfs") }
func (g *Gocryptfs) fusermount() string { return orDefault(g.Fusermount, "fusermount3") }
func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// Exists reports whether the storage was created (its gocryptfs.conf exists).
func (g *Gocryptfs) Exists() (bool, error) {
	return exists(g.confFile())
}

func exists(path string) (bool, error) {
	_, err := os.Stat(path)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, os.ErrNotExist):
		return false, nil
	}
	return false, err
}

// mustExist returns ErrNotCreated unless the storage was created.
func (g *Gocryptfs) mustExist() error {
	ok, err := g.Exists()
	if err == nil && !ok {
		err = ErrNotCreated
	}
	return err
}

// Create makes a new, empty storage keyed with key. Storage left by an interrupted first
// boot (created, never initialized) is replaced: its key was random and lived only in the
// previous boot's memory, so nothing in it can be read again. Initialized storage is never
// replaced.
func (g *Gocryptfs) Create(ctx context.Context, key []byte) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if initialized, err := g.Initialized(); err != nil {
		return err
	} else if initialized {
		return fmt.Errorf("state storage in %s is initialized: refusing to replace it", g.Dir)
	}
	if err := g.Lock(ctx); err != nil {
		return err
	}
	if err := os.RemoveAll(g.cipherDir()); err != nil {
		return fmt.Errorf("removing unfinished state storage: %w", err)
	}
	if err := os.MkdirAll(g.cipherDir(), 0o700); err != nil {
		return fmt.Errorf("creating state storage: %w", err)
	}
	if _, err := g.run(ctx, password(key), "-init", "-q", "-scryptn", gocryptfsScryptN, g.cipherDir()); err != nil {
		return fmt.Errorf("creating state storage: %w", err)
	}
	if err := fileutil.WriteAtomic(g.uuidFile(), []byte(uuid.NewString()+"\n"), 0o600); err != nil {
		return fmt.Errorf("creating state storage: %w", err)
	}
	return nil
}

// UUID returns the storage's id.
func (g *Gocryptfs) UUID() (string, error) {
	data, err := os.ReadFile(g.uuidFile())
	if errors.Is(err, os.ErrNotExist) {
		return "", ErrNotCreated
	}
	if err != nil {
		return "", err
	}
	id := strings.TrimSpace(string(data))
	if !ValidUUID(id) {
		return "", fmt.Errorf("state storage id %q in %s is not a lower-case UUID", id, g.uuidFile())
	}
	return id, nil
}

// Initialized reports whether the marker exists.
func (g *Gocryptfs) Initialized() (bool, error) {
	return exists(g.markerFile())
}

// MarkInitialized writes the marker.
func (g *Gocryptfs) MarkInitialized() error {
	if err := g.mustExist(); err != nil {
		return err
	}
	return fileutil.WriteAtomic(g.markerFile(), []byte("initialized\n"), 0o600)
}

// Rekey re-wraps the master key with newKey.
func (g *Gocryptfs) Rekey(ctx context.Context, oldKey, newKey []byte) error {
	if err := checkKey(oldKey); err != nil {
		return err
	}
	if err := checkKey(newKey); err != nil {
		return err
	}
	if err := g.mustExist(); err != nil {
		return err
	}
	// gocryptfs reads the old password, then the new one, from stdin, and replaces
	// gocryptfs.conf atomically (it writes a temporary file and renames it).
	if _, err := g.run(ctx, append(password(oldKey), password(newKey)...), "-passwd", "-q", "-scryptn", gocryptfsScryptN, g.cipherDir()); err != nil {
		return fmt.Errorf("rekeying state storage: %w", err)
	}
	return nil
}

// maxConfSize bounds the gocryptfs.conf CheckKey copies (a real one has about 400 bytes;
// the file is on the disk, outside the encryption, so whoever controls the disk writes it).
const maxConfSize = 64 << 10

// CheckKey asks gocryptfs whether key unwraps the storage's master key, without mounting and
// without touching the storage: gocryptfs -passwd runs on a private copy of gocryptfs.conf
// (-config), so gocryptfs' own code checks the password (scrypt, then AES-GCM of the wrapped
// master key) and re-wraps the master key into the copy only, with a random throwaway key;
// the copy is removed. A wrong key is ErrWrongKey.
func (g *Gocryptfs) CheckKey(ctx context.Context, key []byte) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if err := g.mustExist(); err != nil {
		return err
	}
	conf, err := readLimited(g.confFile(), maxConfSize)
	if err != nil {
		return fmt.Errorf("checking the key of the state storage: %w", err)
	}
	dir, err := os.MkdirTemp(g.Dir, ".check-key-") // mode 0700
	if err != nil {
		return fmt.Errorf("checking the key of the state storage: %w", err)
	}
	defer os.RemoveAll(dir)
	copyPath := filepath.Join(dir, "gocryptfs.conf")
	if err := os.WriteFile(copyPath, conf, 0o600); err != nil {
		return fmt.Errorf("checking the key of the state storage: %w", err)
	}
	throwaway, err := NewRandomKey()
	if err != nil {
		return err
	}
	if _, err := g.run(ctx, append(password(key), password(throwaway)...), "-passwd", "-q", "-scryptn", gocryptfsScryptN, "-config", copyPath, g.cipherDir()); err != nil {
		if errors.Is(err, ErrWrongKey) {
			return err
		}
		return fmt.Errorf("checking the key of the state storage: %w", err)
	}
	return nil
}

// readLimited reads path, refusing a file larger than limit or one that is not regular.
func readLimited(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, limit)
	}
	return data, nil
}

// Unlock mounts the plaintext view. gocryptfs runs on as a daemon serving the mount until
// Lock unmounts it.
func (g *Gocryptfs) Unlock(ctx context.Context, key []byte) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if err := g.mustExist(); err != nil {
		return err
	}
	if mounted, err := isMountPoint(g.MountPoint); err != nil {
		return err
	} else if mounted {
		return fmt.Errorf("%s is already mounted", g.MountPoint)
	}
	if err := os.MkdirAll(g.MountPoint, 0o700); err != nil {
		return fmt.Errorf("creating mount point: %w", err)
	}
	// -nosyslog: the daemon's messages go to our stderr capture, not a syslog nobody reads.
	// -allow_other: see the type's doc.
	if _, err := g.run(ctx, password(key), "-q", "-nosyslog", "-allow_other", g.cipherDir(), g.MountPoint); err != nil {
		return fmt.Errorf("unlocking state storage: %w", err)
	}
	return nil
}

// Lock unmounts the plaintext view, which ends the gocryptfs daemon.
func (g *Gocryptfs) Lock(ctx context.Context) error {
	mounted, err := isMountPoint(g.MountPoint)
	if err != nil || !mounted {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, commandTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, g.fusermount(), "-u", g.MountPoint).CombinedOutput()
	if err != nil {
		return fmt.Errorf("unmounting %s: %w: %s", g.MountPoint, err, bytes.TrimSpace(out))
	}
	return nil
}

// run runs gocryptfs with stdin; a wrong password becomes ErrWrongKey.
func (g *Gocryptfs) run(ctx context.Context, stdin []byte, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, commandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, g.binary(), args...)
	cmd.Stdin = bytes.NewReader(stdin)
	// Output goes to a file, not a pipe: a mount leaves a daemon that inherits stdout and
	// stderr, and exec would wait for a pipe's writers to close, that is, until unmount.
	// The file is anonymous memory (memfd): it has no name in a shared directory such as
	// /tmp that someone could plant a symlink or a readable file at, and what gocryptfs says
	// about the key file never reaches a disk.
	out, err := memFile("gocryptfs-out")
	if err != nil {
		return nil, err
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	runErr := cmd.Run()
	output, err := readAll(out)
	if err != nil {
		return nil, fmt.Errorf("reading the output of %s: %w", g.binary(), err)
	}
	var exit *exec.ExitError
	if errors.As(runErr, &exit) && exit.ExitCode() == gocryptfsWrongPassword {
		return nil, ErrWrongKey
	}
	if runErr != nil {
		return nil, fmt.Errorf("%s %s: %w: %s", g.binary(), args[0], runErr, bytes.TrimSpace(output))
	}
	return output, nil
}

func password(key []byte) []byte {
	return []byte(hex.EncodeToString(key) + "\n")
}

// isMountPoint reports whether path is the root of a mount: its device differs from its
// parent's (FUSE mounts always get their own device number).
func isMountPoint(path string) (bool, error) {
	var st, parent unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		// A FUSE mount whose daemon died answers ENOTCONN: still mounted, needs unmounting.
		if errors.Is(err, unix.ENOTCONN) {
			return true, nil
		}
		return false, fmt.Errorf("stat %s: %w", path, err)
	}
	if err := unix.Stat(filepath.Dir(filepath.Clean(path)), &parent); err != nil {
		return false, fmt.Errorf("stat parent of %s: %w", path, err)
	}
	return st.Dev != parent.Dev || st.Ino == parent.Ino, nil
}

// memFile creates an anonymous in-memory file (memfd_create), closed on exec except where
// it is passed on explicitly.
func memFile(name string) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("creating an in-memory file: %w", err)
	}
	return os.NewFile(uintptr(fd), name), nil
}

// readAll reads f from its start (a child wrote to it through a shared offset).
func readAll(f *os.File) ([]byte, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	return io.ReadAll(f)
}
