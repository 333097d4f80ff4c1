// Package fileutil writes small files so that a crash leaves either the old content or the
// new one, never a torn or unsynced file: what secrets, markers and ids on a node need.
package fileutil

import (
	"fmt"
	"os"
	"path/filepath"
)

// WriteAtomic writes data to path through a synced temporary file that replaces path by
// rename, then syncs the directory so the rename is durable.
func WriteAtomic(path string, data []byte, perm os.FileMode) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	if err := WriteSync(f, data); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
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

// CreateAtomic writes data to path like WriteAtomic, but only if path does not exist: the
// synced temporary file is hard-linked to path, which fails (wrapping os.ErrExist) if path
// exists, so a file another process creates meanwhile is never replaced either.
func CreateAtomic(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if err := WriteSync(f, data); err != nil {
		return err
	}
	if err := os.Link(tmp, path); err != nil {
		return err
	}
	return SyncDir(dir)
}
