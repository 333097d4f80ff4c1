package fileutil_test

import (
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
