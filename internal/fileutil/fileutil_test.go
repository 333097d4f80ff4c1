package fileutil_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/fileutil"
)

func TestWriteAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "marker")
	require.NoError(t, fileutil.WriteAtomic(path, []byte("one"), 0o600))
	require.NoError(t, fileutil.WriteAtomic(path, []byte("two"), 0o600), "replaces")
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "two", string(data))
	info, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, 1, "no temporary file left")

	assert.Error(t, fileutil.WriteAtomic(filepath.Join(dir, "missing", "x"), []byte("x"), 0o600))
}

func TestCreateAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "conf.yaml")
	require.NoError(t, fileutil.CreateAtomic(path, []byte("one"), 0o640))
	err := fileutil.CreateAtomic(path, []byte("two"), 0o640)
	require.ErrorIs(t, err, os.ErrExist, "never replaces")
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "one", string(data))
	info, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o640), info.Mode().Perm())
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, 1, "no temporary file left")

	assert.Error(t, fileutil.CreateAtomic(filepath.Join(dir, "missing", "x"), []byte("x"), 0o600))
}

// A symlink planted at the target itself is replaced (WriteAtomic) or refused
// (CreateAtomic), never written through.
func TestSymlinkAtTarget(t *testing.T) {
	for name, write := range map[string]func(string, []byte, os.FileMode) error{"WriteAtomic": fileutil.WriteAtomic, "CreateAtomic": fileutil.CreateAtomic} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			victim := filepath.Join(t.TempDir(), "victim")
			require.NoError(t, os.WriteFile(victim, []byte("victim"), 0o644))
			path := filepath.Join(dir, "master.key")
			require.NoError(t, os.Symlink(victim, path))
			err := write(path, []byte("secret"), 0o600)
			if name == "CreateAtomic" {
				require.ErrorIs(t, err, os.ErrExist)
			} else {
				require.NoError(t, err)
				info, err := os.Lstat(path)
				require.NoError(t, err)
				assert.True(t, info.Mode().IsRegular())
				assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())
			}
			data, err := os.ReadFile(victim)
			require.NoError(t, err)
			assert.Equal(t, "victim", string(data))
		})
	}
}

// The final file has exactly the requested mode, wider or narrower than the 0600 of the
// temporary file, and replacing a file does not keep the old file's mode.
func TestRequestedMode(t *testing.T) {
	dir := t.TempDir()
	for _, perm := range []os.FileMode{0o600, 0o400, 0o640, 0o644} {
		path := filepath.Join(dir, fmt.Sprintf("f%o", perm))
		require.NoError(t, os.WriteFile(path, []byte("old"), 0o666))
		require.NoError(t, os.Chmod(path, 0o666))
		require.NoError(t, fileutil.WriteAtomic(path, []byte("new"), perm))
		info, err := os.Stat(path)
		require.NoError(t, err)
		assert.Equal(t, perm, info.Mode().Perm(), "%o", perm)
	}
}
