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
