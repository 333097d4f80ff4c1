package fileutil

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// predictableSuffixes makes the temporary names of this test predictable: the first name a
// write tries is one an attacker could compute in advance, and planted there.
func predictableSuffixes(t *testing.T, names ...string) {
	t.Helper()
	orig := randomSuffix
	var mu sync.Mutex
	i := 0
	randomSuffix = func() string {
		mu.Lock()
		defer mu.Unlock()
		if i < len(names) {
			i++
			return names[i-1]
		}
		return orig()
	}
	t.Cleanup(func() { randomSuffix = orig })
}

type writer struct {
	name  string
	write func(path string, data []byte, perm os.FileMode) error
}

var writers = []writer{{"WriteAtomic", WriteAtomic}, {"CreateAtomic", CreateAtomic}}

// An attacker who can write to the directory plants a symlink at the exact temporary name a
// write will try first (and at the old fixed name path+".tmp"), pointing at a file it wants
// overwritten or read. The write must not follow it: the victim is untouched, the secret
// lands only at its own path with its own mode.
func TestAttackSymlinkAtTempName(t *testing.T) {
	for _, w := range writers {
		t.Run(w.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "ca.key")
			victim := filepath.Join(t.TempDir(), "victim")
			require.NoError(t, os.WriteFile(victim, []byte("victim"), 0o644))
			for _, name := range []string{
				path + ".tmp",          // the old fixed name
				".ca.key.planted1.tmp", // the names the write tries first
				".ca.key.planted2.tmp",
			} {
				require.NoError(t, os.Symlink(victim, filepath.Join(dir, filepath.Base(name))))
			}
			// A dangling symlink would make O_CREAT without O_EXCL create the attacker's target.
			dangling := filepath.Join(t.TempDir(), "created-by-us")
			predictableSuffixes(t, "planted1", "planted2", "dangling")
			require.NoError(t, os.Symlink(dangling, filepath.Join(dir, ".ca.key.dangling.tmp")))

			require.NoError(t, w.write(path, []byte("secret"), 0o600))

			data, err := os.ReadFile(victim)
			require.NoError(t, err)
			assert.Equal(t, "victim", string(data), "the symlink's target is untouched")
			info, err := os.Stat(victim)
			require.NoError(t, err)
			assert.Equal(t, os.FileMode(0o644), info.Mode().Perm())
			assert.NoFileExists(t, dangling, "a dangling symlink is not followed to create a file")
			assertSecretFile(t, path, "secret", 0o600)
		})
	}
}

// A leftover (or planted) temporary file with mode 0666 sits at the old fixed name and at the
// first name the write tries. The new secret must not inherit its mode, nor reuse it.
func TestAttackLeftoverWorldWritableTemp(t *testing.T) {
	for _, w := range writers {
		t.Run(w.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "init-secret")
			predictableSuffixes(t, "leftover")
			for _, name := range []string{path + ".tmp", filepath.Join(dir, ".init-secret.leftover.tmp")} {
				require.NoError(t, os.WriteFile(name, []byte("old"), 0o666))
				require.NoError(t, os.Chmod(name, 0o666)) // past the umask
			}
			require.NoError(t, w.write(path, []byte("secret"), 0o600))
			assertSecretFile(t, path, "secret", 0o600)
			data, err := os.ReadFile(filepath.Join(dir, ".init-secret.leftover.tmp"))
			require.NoError(t, err)
			assert.Equal(t, "old", string(data), "the leftover was not reused")
		})
	}
}

// Planting a file at every name a write tries makes it fail closed with a clear error,
// never fall back to opening one of them.
func TestAttackAllTempNamesTaken(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sa.key")
	names := make([]string, tempAttempts)
	for i := range names {
		names[i] = fmt.Sprintf("taken%d", i)
		require.NoError(t, os.WriteFile(filepath.Join(dir, ".sa.key."+names[i]+".tmp"), nil, 0o666))
	}
	predictableSuffixes(t, names...)
	err := WriteAtomic(path, []byte("secret"), 0o600)
	require.ErrorIs(t, err, os.ErrExist)
	assert.ErrorContains(t, err, "creating a temporary file for "+path)
	assert.NoFileExists(t, path)
}

// The temporary file is 0600 from the moment it exists, whatever the umask and whatever
// mode is requested in the end: the content is never readable by others, not even briefly.
func TestTempFileIsPrivateFromCreation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cert.crt")
	f, err := createTemp(path)
	require.NoError(t, err)
	t.Cleanup(func() { f.Close(); os.Remove(f.Name()) })
	info, err := os.Lstat(f.Name())
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	assert.True(t, info.Mode().IsRegular())
	assert.Equal(t, filepath.Dir(path), filepath.Dir(f.Name()), "in the target's directory, so the rename is atomic")
	matched, err := filepath.Match(TempPattern(path), f.Name())
	require.NoError(t, err)
	assert.True(t, matched)
}

func assertSecretFile(t *testing.T, path, content string, perm os.FileMode) {
	t.Helper()
	info, err := os.Lstat(path)
	require.NoError(t, err)
	assert.True(t, info.Mode().IsRegular(), "a regular file, not a symlink")
	assert.Equal(t, perm, info.Mode().Perm())
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, content, string(data))
}

// Concurrent writers of the same file never corrupt each other: each uses its own
// temporary file, the result is exactly one writer's content, and readers meanwhile see only
// whole versions.
func TestConcurrentWriters(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state")
	const writers, size = 8, 64 << 10
	contents := make([][]byte, writers)
	for i := range contents {
		contents[i] = bytes.Repeat([]byte{byte('a' + i)}, size)
	}
	require.NoError(t, WriteAtomic(path, contents[0], 0o600))
	var wg sync.WaitGroup
	errs := make(chan error, writers*20+1)
	for i := range writers {
		wg.Go(func() {
			for range 20 {
				errs <- WriteAtomic(path, contents[i], 0o600)
			}
		})
	}
	done := make(chan struct{})
	var readerErr error
	go func() {
		defer close(done)
		for range 200 {
			data, err := os.ReadFile(path)
			if err != nil {
				readerErr = err
				return
			}
			if len(data) != size || !bytes.Equal(data, bytes.Repeat(data[:1], size)) {
				readerErr = fmt.Errorf("torn read: %d bytes", len(data))
				return
			}
		}
	}()
	wg.Wait()
	<-done
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, readerErr)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Contains(t, contents, data)
	leftovers, err := filepath.Glob(TempPattern(path))
	require.NoError(t, err)
	assert.Empty(t, leftovers, "no temporary file left behind")
}
