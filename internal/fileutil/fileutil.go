// Package fileutil writes small files so that a crash leaves either the old content or the
// new one, never a torn or unsynced file: what secrets, markers and ids on a node need.
//
// Every write goes through a temporary file in the target's directory that this process
// creates exclusively (O_CREAT|O_EXCL|O_NOFOLLOW) with mode 0600 and a random name: a file or
// symlink someone planted at any name is never opened, followed, truncated or reused, so it
// can neither redirect the write nor lend its (looser) mode to a secret. The content is
// written while the file is 0600, the requested mode is set on the open file, the file is
// synced and only then renamed (or linked) to its name, and the directory is synced.
package fileutil

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// tempMode is the mode every temporary file is created with: readable by its owner only,
// whatever it will hold.
const tempMode = 0o600

// tempAttempts bounds the retries on a name that exists: with 64 random bits a collision
// is an attacker's plant (or a leftover), never chance, and 16 plants in a row cannot happen
// by luck either.
const tempAttempts = 16

// randomSuffix names a temporary file; a variable so tests can make names predictable and
// plant files at exactly the name the write will try first.
var randomSuffix = func() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b) // crypto/rand.Read never returns an error (it crashes instead).
	return hex.EncodeToString(b)
}

// TempPattern is the glob of the temporary files a write of path uses (".<base>.*.tmp" in
// path's directory): what to clean up, or what an attacker would target.
func TempPattern(path string) string {
	return filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
}

// createTemp creates a new, empty temporary file for path in path's directory, exclusively
// and with mode 0600. It never opens an existing file or follows a symlink: O_EXCL fails on
// any existing name, symlinks included.
func createTemp(path string) (*os.File, error) {
	dir, base := filepath.Dir(path), filepath.Base(path)
	var err error
	for range tempAttempts {
		name := filepath.Join(dir, "."+base+"."+randomSuffix()+".tmp")
		var f *os.File
		f, err = os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, tempMode)
		if err == nil {
			// The umask may have tightened 0600 further; make it exactly 0600 so the owner
			// can write and nobody else can read, whatever the process's umask.
			if err := f.Chmod(tempMode); err != nil {
				f.Close()
				os.Remove(name)
				return nil, fmt.Errorf("temporary file for %s: %w", path, err)
			}
			return f, nil
		}
		if !errors.Is(err, os.ErrExist) {
			break
		}
	}
	return nil, fmt.Errorf("creating a temporary file for %s: %w", path, err)
}

// writeTemp writes data to a new temporary file for path, sets perm on it and syncs it. It
// returns the temporary file's name; on error nothing is left behind.
func writeTemp(path string, data []byte, perm os.FileMode) (string, error) {
	f, err := createTemp(path)
	if err != nil {
		return "", err
	}
	tmp := f.Name()
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(tmp)
		return "", fmt.Errorf("writing %s: %w", tmp, err)
	}
	// The data was written while the file was 0600; perm is set on the open file (never by
	// name, which someone could have swapped) before the file gets its final name.
	if err := f.Chmod(perm.Perm()); err != nil {
		f.Close()
		os.Remove(tmp)
		return "", fmt.Errorf("setting the mode of %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(tmp)
		return "", fmt.Errorf("syncing %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("closing %s: %w", tmp, err)
	}
	return tmp, nil
}

// WriteAtomic writes data to path with mode perm through a synced temporary file that
// replaces path by rename, then syncs the directory so the rename is durable. If path is a
// symlink, the symlink is replaced, never written through.
func WriteAtomic(path string, data []byte, perm os.FileMode) error {
	tmp, err := writeTemp(path, data, perm)
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return SyncDir(filepath.Dir(path))
}

// CreateAtomic writes data to path like WriteAtomic, but only if path does not exist: the
// synced temporary file is hard-linked to path, which fails (wrapping os.ErrExist) if path
// exists, a symlink included, so a file another process creates meanwhile is never replaced
// and a planted symlink is never followed.
func CreateAtomic(path string, data []byte, perm os.FileMode) error {
	tmp, err := writeTemp(path, data, perm)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	if err := os.Link(tmp, path); err != nil {
		return err
	}
	return SyncDir(filepath.Dir(path))
}

// WriteSync writes data to the already opened f, syncs and closes it (closing it on error too).
func WriteSync(f *os.File, data []byte) error {
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", f.Name(), err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("syncing %s: %w", f.Name(), err)
	}
	return f.Close()
}

// SyncDir syncs a directory, making creations and renames in it durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("syncing directory %s: %w", dir, err)
	}
	return nil
}
