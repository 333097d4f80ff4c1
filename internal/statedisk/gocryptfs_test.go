package statedisk_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/statedisk"
)

// newGocryptfs returns storage in a temp dir; cleanup unmounts it whatever the test did.
func newGocryptfs(t *testing.T) *statedisk.Gocryptfs {
	t.Helper()
	dir := t.TempDir()
	g := &statedisk.Gocryptfs{Dir: filepath.Join(dir, "state"), MountPoint: filepath.Join(dir, "mnt")}
	// Registered after TempDir's cleanup, so it runs first: unmount, then remove.
	t.Cleanup(func() { assert.NoError(t, g.Lock(context.Background())) })
	return g
}

func key(t *testing.T) []byte {
	k, err := statedisk.NewRandomKey()
	require.NoError(t, err)
	return k
}

const secretContent = "etcd-member-data: 0123456789-very-secret"

func TestGocryptfsLifecycle(t *testing.T) {
	ctx := context.Background()
	g := newGocryptfs(t)

	ok, err := g.Exists()
	require.NoError(t, err)
	assert.False(t, ok, "a fresh node has no storage")
	_, err = g.UUID()
	assert.ErrorIs(t, err, statedisk.ErrNotCreated)
	assert.ErrorIs(t, g.Unlock(ctx, key(t)), statedisk.ErrNotCreated)

	// Fresh node: random key.
	random := key(t)
	require.NoError(t, g.Create(ctx, random))
	id, err := g.UUID()
	require.NoError(t, err)
	assert.True(t, statedisk.ValidUUID(id), id)
	initialized, err := g.Initialized()
	require.NoError(t, err)
	assert.False(t, initialized)

	// Init/join: re-key to the derived key, mark, unlock, write state.
	derived := key(t)
	require.NoError(t, g.Rekey(ctx, random, derived))
	require.NoError(t, g.MarkInitialized())
	require.NoError(t, g.Unlock(ctx, derived))
	require.NoError(t, os.MkdirAll(filepath.Join(g.MountPoint, "etcd", "member"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(g.MountPoint, "etcd", "member", "snap.db"), []byte(secretContent), 0o600))
	assert.Error(t, g.Unlock(ctx, derived), "a second unlock of a mounted storage is refused")
	require.NoError(t, g.Lock(ctx))
	require.NoError(t, g.Lock(ctx), "locking twice is not an error")

	t.Run("data unreadable without the key", func(t *testing.T) {
		_, err := os.Stat(filepath.Join(g.MountPoint, "etcd"))
		assert.ErrorIs(t, err, fs.ErrNotExist, "locked: no plaintext view")
		var files int
		require.NoError(t, filepath.WalkDir(g.Dir, func(path string, d fs.DirEntry, err error) error {
			require.NoError(t, err)
			assert.NotContains(t, d.Name(), "etcd", "file names are encrypted")
			assert.NotContains(t, d.Name(), "snap", "file names are encrypted")
			if d.Type().IsRegular() {
				files++
				data, err := os.ReadFile(path)
				require.NoError(t, err)
				assert.False(t, bytes.Contains(data, []byte("very-secret")), "plaintext in %s", path)
			}
			return nil
		}))
		assert.Greater(t, files, 3)
	})

	t.Run("wrong keys rejected", func(t *testing.T) {
		for name, k := range map[string][]byte{"random key of the fresh node": random, "another key": key(t)} {
			assert.ErrorIs(t, g.Unlock(ctx, k), statedisk.ErrWrongKey, name)
			assert.ErrorIs(t, g.Rekey(ctx, k, key(t)), statedisk.ErrWrongKey, name)
		}
		assert.ErrorContains(t, g.Unlock(ctx, []byte("short")), "state key of 5 bytes")
	})

	t.Run("reboot", func(t *testing.T) {
		initialized, err := g.Initialized()
		require.NoError(t, err)
		assert.True(t, initialized)
		again, err := g.UUID()
		require.NoError(t, err)
		assert.Equal(t, id, again, "the id is stable: the rejoin ticket's key is the same")
		require.NoError(t, g.Unlock(ctx, derived))
		data, err := os.ReadFile(filepath.Join(g.MountPoint, "etcd", "member", "snap.db"))
		require.NoError(t, err)
		assert.Equal(t, secretContent, string(data))
		require.NoError(t, g.Lock(ctx))
	})

	// Mounted -allow_other: another user gets what the files' permissions give it (a pod's
	// volume), and no more (the root-only etcd data).
	t.Run("other users by the files' permissions", func(t *testing.T) {
		require.NoError(t, g.Unlock(ctx, derived))
		defer func() { require.NoError(t, g.Lock(ctx)) }()
		// The test's temporary directories are 0700: open the way to the mount point.
		for dir := g.MountPoint; strings.HasPrefix(dir, os.TempDir()+"/"); dir = filepath.Dir(dir) {
			require.NoError(t, os.Chmod(dir, 0o755))
		}
		vol := filepath.Join(g.MountPoint, "volume")
		require.NoError(t, os.Mkdir(vol, 0o777))
		require.NoError(t, os.Chmod(vol, 0o777))
		asNobody := func(script string) ([]byte, error) {
			cmd := exec.Command("sh", "-c", script)
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
			return cmd.CombinedOutput()
		}
		out, err := asNobody("echo written > " + vol + "/file && cat " + vol + "/file")
		require.NoError(t, err, "%s", out)
		assert.Equal(t, "written\n", string(out))
		out, err = asNobody("cat " + filepath.Join(g.MountPoint, "etcd", "member", "snap.db"))
		assert.Error(t, err, "%s", out)
		assert.Contains(t, string(out), "Permission denied")
	})

	t.Run("initialized storage is never replaced", func(t *testing.T) {
		err := g.Create(ctx, key(t))
		assert.ErrorContains(t, err, "initialized: refusing to replace it")
		require.NoError(t, g.Unlock(ctx, derived))
		data, err := os.ReadFile(filepath.Join(g.MountPoint, "etcd", "member", "snap.db"))
		require.NoError(t, err)
		assert.Equal(t, secretContent, string(data))
	})
}

// A first boot that ended between Create and MarkInitialized left storage nobody can open:
// the next boot replaces it with a new id.
func TestGocryptfsInterruptedFirstBoot(t *testing.T) {
	ctx := context.Background()
	g := newGocryptfs(t)
	require.NoError(t, g.Create(ctx, key(t)))
	first, err := g.UUID()
	require.NoError(t, err)

	k := key(t)
	require.NoError(t, g.Create(ctx, k))
	second, err := g.UUID()
	require.NoError(t, err)
	assert.NotEqual(t, first, second)
	require.NoError(t, g.Unlock(ctx, k))
}

func TestGocryptfsTamperedID(t *testing.T) {
	g := newGocryptfs(t)
	require.NoError(t, g.Create(context.Background(), key(t)))
	for _, bad := range []string{"3F2504E0-4F89-11D3-9A0C-0305E82C3301", "../../etc/passwd", "", strings.Repeat("a", 36)} {
		require.NoError(t, os.WriteFile(filepath.Join(g.Dir, "uuid"), []byte(bad), 0o600))
		_, err := g.UUID()
		assert.ErrorContains(t, err, "is not a lower-case UUID", bad)
	}
}

// CheckKey is gocryptfs' own password check, and leaves the storage exactly as it was:
// no mount, no file changed, added or left behind, whatever the key.
func TestGocryptfsCheckKey(t *testing.T) {
	if testing.Short() {
		t.Skip("runs gocryptfs")
	}
	ctx := context.Background()
	g := newGocryptfs(t)
	assert.ErrorIs(t, g.CheckKey(ctx, key(t)), statedisk.ErrNotCreated)
	random, derived := key(t), key(t)
	require.NoError(t, g.Create(ctx, random))
	require.NoError(t, g.Rekey(ctx, random, derived))
	require.NoError(t, g.MarkInitialized())
	before := treeSums(t, g.Dir)

	for name, tc := range map[string]struct {
		key     []byte
		wantErr error
		errText string
	}{
		"the disk key":                {key: derived},
		"the fresh node's random key": {key: random, wantErr: statedisk.ErrWrongKey},
		"another key":                 {key: key(t), wantErr: statedisk.ErrWrongKey},
		"a key of the wrong size":     {key: []byte("short"), errText: "state key of 5 bytes"},
		"the disk key's hex as a key": {key: []byte(strings.Repeat("ab", 16)), wantErr: statedisk.ErrWrongKey},
	} {
		t.Run(name, func(t *testing.T) {
			err := g.CheckKey(ctx, tc.key)
			switch {
			case tc.wantErr != nil:
				assert.ErrorIs(t, err, tc.wantErr)
			case tc.errText != "":
				assert.ErrorContains(t, err, tc.errText)
			default:
				assert.NoError(t, err)
			}
			assert.Equal(t, before, treeSums(t, g.Dir), "the storage is unchanged, no copy left behind")
			_, err = os.Stat(g.MountPoint)
			assert.ErrorIs(t, err, fs.ErrNotExist, "nothing mounted")
		})
	}
	// The checked key is the one that unlocks.
	require.NoError(t, g.Unlock(ctx, derived))
	assert.NoError(t, g.CheckKey(ctx, derived), "checking works while unlocked too")
	assert.ErrorIs(t, g.CheckKey(ctx, random), statedisk.ErrWrongKey)

	t.Run("oversized configuration refused before gocryptfs runs", func(t *testing.T) {
		require.NoError(t, g.Lock(ctx))
		conf := filepath.Join(g.Dir, "cipher", "gocryptfs.conf")
		require.NoError(t, os.Chmod(conf, 0o600))
		require.NoError(t, os.WriteFile(conf, bytes.Repeat([]byte{' '}, 1<<20), 0o600))
		assert.ErrorContains(t, g.CheckKey(ctx, derived), "larger than")
	})
}

// treeSums maps every path under dir to the SHA-256 of its content ("dir" for directories).
func treeSums(t *testing.T, dir string) map[string]string {
	t.Helper()
	sums := map[string]string{}
	require.NoError(t, filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		require.NoError(t, err)
		rel, err := filepath.Rel(dir, path)
		require.NoError(t, err)
		if d.IsDir() {
			sums[rel] = "dir"
			return nil
		}
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		sum := sha256.Sum256(data)
		sums[rel] = hex.EncodeToString(sum[:])
		return nil
	}))
	return sums
}
