package unlock_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/csidriver/unlock"
	"github.com/openconstellation/constellation/internal/statedisk"
)

// What the LUKS2 unlocker refuses before any mapping exists, on a real cryptsetup: a disk
// that is neither a volume nor zeros, and a header the host made that fails the header
// policy. Neither is formatted or changed. (Formatting, opening and mounting need
// device-mapper: the QEMU machine test stages a volume in a machine.)
func TestLUKS2Refuses(t *testing.T) {
	if testing.Short() {
		t.Skip("runs cryptsetup")
	}
	ctx := context.Background()
	for name, tc := range map[string]struct {
		fill    func(t *testing.T, file string)
		wantErr error
		want    string
	}{
		"data that is not a volume": {
			fill: func(t *testing.T, file string) {
				junk := make([]byte, 4096)
				_, _ = rand.Read(junk)
				writeAt(t, file, junk, 512<<10)
			},
			want: "neither a LUKS2 volume nor zeros",
		},
		"a header without integrity": {
			fill: func(t *testing.T, file string) {
				cmd := exec.Command("cryptsetup", "luksFormat", "--type", "luks2", "--batch-mode",
					"--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000", "--key-file", "-", file)
				cmd.Stdin = bytes.NewReader(bytes.Repeat([]byte{7}, statedisk.KeySize))
				out, err := cmd.CombinedOutput()
				require.NoError(t, err, "%s", out)
			},
			wantErr: statedisk.ErrHeaderRefused,
			want:    "the volume was not changed",
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir, file := volumeFile(t, 64*mib)
			tc.fill(t, file)
			before, err := os.ReadFile(file)
			require.NoError(t, err)
			u := &unlock.LUKS2{WorkDir: filepath.Join(dir, "work")}
			err = u.Stage(ctx, file, newKey(t), filepath.Join(dir, "target"))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			if tc.wantErr != nil {
				assert.ErrorIs(t, err, tc.wantErr)
			}
			after, err := os.ReadFile(file)
			require.NoError(t, err)
			assert.True(t, bytes.Equal(before, after), "the disk is as it was")
		})
	}
}

func TestLUKS2UnstageAndExpand(t *testing.T) {
	dir := t.TempDir()
	u := &unlock.LUKS2{WorkDir: filepath.Join(dir, "work")}
	assert.NoError(t, u.Unstage(context.Background(), filepath.Join(dir, "never-staged")), "nothing staged: nothing to do")
	assert.ErrorIs(t, u.Expand(context.Background(), filepath.Join(dir, "t")), unlock.ErrExpandUnsupported)
}

func writeAt(t *testing.T, file string, data []byte, off int64) {
	t.Helper()
	f, err := os.OpenFile(file, os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteAt(data, off)
	require.NoError(t, err)
	require.NoError(t, f.Close())
}
