package volumes

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestHelper(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(outside, "keep"), []byte("x"), 0o600))
	vol := filepath.Join(root, "pvc-1_default_data-0")

	// create: a directory every user can write, twice without error (a retried helper pod).
	for range 2 {
		require.NoError(t, Helper(root, []string{"-p", vol, "-s", "1024", "-m", "Filesystem", "-a", "create"}, io.Discard))
		fi, err := os.Stat(vol)
		require.NoError(t, err)
		assert.Equal(t, os.ModeDir|0o777, fi.Mode())
	}
	require.NoError(t, os.WriteFile(filepath.Join(vol, "data"), []byte("x"), 0o600))

	testCases := map[string]struct {
		args    []string
		wantErr string
	}{
		"outside the root":      {args: []string{"-p", outside, "-a", "delete"}, wantErr: "not a volume's own directory"},
		"the root itself":       {args: []string{"-p", root, "-a", "delete"}, wantErr: "not a volume's own directory"},
		"escaping with ..":      {args: []string{"-p", root + "/../" + filepath.Base(outside), "-a", "delete"}, wantErr: "not a volume's own directory"},
		"nested":                {args: []string{"-p", filepath.Join(vol, "data"), "-a", "delete"}, wantErr: "not a volume's own directory"},
		"relative":              {args: []string{"-p", "pvc-1", "-a", "delete"}, wantErr: "not absolute"},
		"no path":               {args: []string{"-a", "create"}, wantErr: "no volume directory"},
		"block volume":          {args: []string{"-p", vol, "-m", "Block", "-a", "create"}, wantErr: "only Filesystem"},
		"unknown action":        {args: []string{"-p", vol, "-a", "resize"}, wantErr: `action "resize"`},
		"stray argument":        {args: []string{"-p", vol, "-a", "delete", "extra"}, wantErr: "unexpected arguments"},
		"unknown flag":          {args: []string{"-x"}, wantErr: "not defined"},
		"a hidden name in root": {args: []string{"-p", filepath.Join(root, ".x"), "-a", "create"}, wantErr: "not a volume's own directory"},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			assert.ErrorContains(t, Helper(root, tc.args, io.Discard), tc.wantErr)
		})
	}
	assert.FileExists(t, filepath.Join(outside, "keep"), "a refused delete removes nothing")
	assert.FileExists(t, filepath.Join(vol, "data"))

	// delete: the volume and what it holds, twice without error.
	for range 2 {
		require.NoError(t, Helper(root, []string{"-p", vol, "-s", "1024", "-m", "Filesystem", "-a", "delete"}, io.Discard))
		assert.NoDirExists(t, vol)
	}
	assert.DirExists(t, root)
}
