package cluster

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLoadedArchives: the image API imports only archives of the cluster's loaded-images
// folder, by file name; anything else is refused before a node is touched.
func TestLoadedArchives(t *testing.T) {
	p := &Provider{spec: Spec{Dir: t.TempDir()}}
	require.NoError(t, os.MkdirAll(p.loadedImagesDir(), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(p.loadedImagesDir(), "a.tar"), []byte("x"), 0o644))

	paths, err := p.loadedArchives([]string{"a.tar"})
	require.NoError(t, err)
	assert.Equal(t, []string{filepath.Join(p.loadedImagesDir(), "a.tar")}, paths)
	for _, bad := range [][]string{nil, {""}, {"../a.tar"}, {"/etc/shadow"}, {"sub/a.tar"}, {".."}, {"a.txt"}, {"missing.tar"}} {
		_, err := p.loadedArchives(bad)
		assert.Error(t, err, "%q", bad)
	}
}

// TestLoadedImagesArgs: a bootstrapper that knows --images-from gets the folder; one of an
// earlier release (no such flag) gets the archives there now, one --image each.
func TestLoadedImagesArgs(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "b.tar"), []byte("x"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a.tar"), []byte("x"), 0o644))
	bin := t.TempDir()
	knows := filepath.Join(bin, "new")
	require.NoError(t, os.WriteFile(knows, []byte("#!/bin/sh\necho '  -images-from value' >&2; exit 2\n"), 0o755))
	old := filepath.Join(bin, "old")
	require.NoError(t, os.WriteFile(old, []byte("#!/bin/sh\necho '  -image value' >&2; exit 2\n"), 0o755))

	assert.Equal(t, []string{"--images-from", dir}, loadedImagesArgs(knows, dir))
	assert.Equal(t, []string{"--image", filepath.Join(dir, "a.tar"), "--image", filepath.Join(dir, "b.tar")}, loadedImagesArgs(old, dir))
	assert.Empty(t, loadedImagesArgs(filepath.Join(bin, "missing"), filepath.Join(dir, "none")))
}
