package unlock_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/openconstellation/constellation/internal/csidriver"
	"github.com/openconstellation/constellation/internal/csidriver/unlock"
	"github.com/openconstellation/constellation/internal/statedisk"
	"github.com/openconstellation/constellation/internal/testtier"
)

const mib = 1 << 20

// volumeFile makes a sparse volume file of zeros, as the provider creates one, and a cleanup
// that unmounts whatever the test left and detaches its loop devices, even after a failure.
func volumeFile(t testing.TB, bytes int64) (dir, file string) {
	t.Helper()
	dir = t.TempDir()
	file = filepath.Join(dir, "vol.img")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	require.NoError(t, os.Truncate(file, bytes))
	t.Cleanup(func() {
		// Mounts under dir, deepest first (the mount table lists parents first).
		data, _ := os.ReadFile("/proc/self/mounts")
		lines := strings.Split(string(data), "\n")
		for i := len(lines) - 1; i >= 0; i-- {
			if f := strings.Fields(lines[i]); len(f) > 1 && strings.HasPrefix(f[1], dir+"/") {
				_ = unix.Unmount(f[1], unix.MNT_DETACH)
			}
		}
		out, _ := exec.Command("losetup", "-j", file, "-O", "NAME", "-n").Output()
		for _, dev := range strings.Fields(string(out)) {
			_ = exec.Command("losetup", "-d", dev).Run()
		}
	})
	return dir, file
}

func newKey(t testing.TB) []byte {
	k, err := statedisk.NewRandomKey()
	require.NoError(t, err)
	return k
}

// loopDevices lists the loop devices backed by file.
func loopDevices(t *testing.T, file string) []string {
	out, err := exec.Command("losetup", "-j", file, "-O", "NAME", "-n").Output()
	require.NoError(t, err)
	return strings.Fields(string(out))
}

func TestGocryptfsVolume(t *testing.T) {
	testtier.Integration(t, "losetup, mkfs.ext4, resize2fs and gocryptfs as root")
	ctx := context.Background()
	dir, file := volumeFile(t, 32*mib)
	g := &unlock.Gocryptfs{WorkDir: filepath.Join(dir, "work")}
	staging := filepath.Join(dir, "staging")
	key := newKey(t)
	secret := []byte("the application's data: 0123456789")
	plain := filepath.Join(staging, "data.txt")

	// Stage a new volume: formatted, then unlocked; staging twice is nothing to do.
	require.NoError(t, g.Stage(ctx, file, key, staging))
	require.NoError(t, g.Stage(ctx, file, key, staging))
	root, err := os.Stat(staging)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o777), root.Mode().Perm(), "every user may write a new volume's root")
	require.NoError(t, os.WriteFile(plain, secret, 0o600))
	st, err := g.Stats(ctx, staging)
	require.NoError(t, err)
	// ext4's journal and tables take their share; the rest is the pod's.
	assert.Greater(t, st.TotalBytes, int64(24*mib), "the volume is as large as its file")
	assert.LessOrEqual(t, st.TotalBytes, int64(32*mib), "the volume is as large as its file")
	assert.Positive(t, st.UsedInodes)

	// Unstage: nothing mounted, no loop device left; twice is nothing to do.
	require.NoError(t, g.Unstage(ctx, staging))
	require.NoError(t, g.Unstage(ctx, staging))
	assert.Empty(t, loopDevices(t, file))
	assert.NoFileExists(t, plain)
	image, err := os.ReadFile(file)
	require.NoError(t, err)
	assert.False(t, bytes.Contains(image, secret), "the host sees no plaintext in the volume file")

	// A wrong key is refused, nothing is formatted, nothing stays mounted. (The ext4
	// superblock's mount count and times do change: the file system was mounted.)
	conf := cipherConf(t, file, dir)
	err = g.Stage(ctx, file, newKey(t), staging)
	require.ErrorIs(t, err, csidriver.ErrWrongKey)
	assert.Empty(t, loopDevices(t, file))
	assert.Equal(t, conf, cipherConf(t, file, dir), "a refused key leaves the encrypted tree as it was")

	// The right key again: the data is there.
	require.NoError(t, g.Stage(ctx, file, key, staging))
	got, err := os.ReadFile(plain)
	require.NoError(t, err)
	assert.Equal(t, secret, got)

	// Expansion: the provider grows the file, the node grows the file system. ext4 grows
	// online only with CAP_SYS_RESOURCE (the node program has it; a sandboxed test may not).
	require.NoError(t, os.Truncate(file, 64*mib))
	if !hasCapSysResource(t) {
		assert.ErrorContains(t, g.Expand(ctx, staging), "resize2fs")
		t.Log("no CAP_SYS_RESOURCE: online expansion checked for its error only")
	} else {
		require.NoError(t, g.Expand(ctx, staging))
		grown, err := g.Stats(ctx, staging)
		require.NoError(t, err)
		assert.Greater(t, grown.TotalBytes, st.TotalBytes+28*mib, "expansion grows the visible capacity")
		got, err = os.ReadFile(plain)
		require.NoError(t, err)
		assert.Equal(t, secret, got)
	}
	// Whatever the capability: the next staging grows the file system before it mounts it.
	require.NoError(t, g.Unstage(ctx, staging))
	require.NoError(t, g.Stage(ctx, file, key, staging))
	grown, err := g.Stats(ctx, staging)
	require.NoError(t, err)
	assert.Greater(t, grown.TotalBytes, st.TotalBytes+28*mib, "staging after an expansion grows the visible capacity")
	got, err = os.ReadFile(plain)
	require.NoError(t, err)
	assert.Equal(t, secret, got, "growing keeps the data")

	// The size is enforced: writing past it fails with ENOSPC, and the host's disk is untouched.
	err = fill(filepath.Join(staging, "big"), 80*mib)
	require.Error(t, err)
	assert.True(t, errors.Is(err, syscall.ENOSPC), "want ENOSPC, got %v", err)
	fi, err := os.Stat(file)
	require.NoError(t, err)
	assert.Equal(t, int64(64*mib), fi.Size())
	require.NoError(t, os.Remove(filepath.Join(staging, "big")))
	require.NoError(t, g.Unstage(ctx, staging))
	assert.Empty(t, loopDevices(t, file))
}

// hasCapSysResource reports whether this process may grow a mounted ext4 file system.
func hasCapSysResource(t *testing.T) bool {
	data, err := os.ReadFile("/proc/self/status")
	require.NoError(t, err)
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			require.NoError(t, err)
			return caps&(1<<unix.CAP_SYS_RESOURCE) != 0
		}
	}
	return false
}

// cipherConf reads gocryptfs.conf (the wrapped master key) from the volume file, as the
// host can: a read-only loop mount.
func cipherConf(t *testing.T, file, dir string) []byte {
	t.Helper()
	view, err := os.MkdirTemp(dir, "host-view-")
	require.NoError(t, err)
	out, err := exec.Command("mount", "-o", "loop,ro,noload", file, view).CombinedOutput()
	require.NoError(t, err, string(out))
	defer func() { assert.NoError(t, exec.Command("umount", view).Run()) }()
	conf, err := os.ReadFile(filepath.Join(view, "cipher", "gocryptfs.conf"))
	require.NoError(t, err)
	return conf
}

// fill writes n bytes to path, then syncs; the first error is returned.
func fill(path string, n int) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	chunk := bytes.Repeat([]byte{0xa5}, mib)
	for written := 0; written < n; written += len(chunk) {
		if _, err := f.Write(chunk); err != nil {
			return err
		}
	}
	return f.Sync()
}

func TestGocryptfsDetectsModifiedCiphertext(t *testing.T) {
	testtier.Integration(t, "losetup, mkfs.ext4 and gocryptfs as root")
	ctx := context.Background()
	dir, file := volumeFile(t, 32*mib)
	g := &unlock.Gocryptfs{WorkDir: filepath.Join(dir, "work")}
	staging := filepath.Join(dir, "staging")
	key := newKey(t)
	require.NoError(t, g.Stage(ctx, file, key, staging))
	require.NoError(t, os.WriteFile(filepath.Join(staging, "data.txt"), bytes.Repeat([]byte("constellation "), 1000), 0o600))
	require.NoError(t, g.Unstage(ctx, staging))

	// The host mounts the volume file itself and flips one byte of the file's ciphertext.
	hostView := filepath.Join(dir, "host")
	require.NoError(t, os.Mkdir(hostView, 0o700))
	out, err := exec.Command("mount", "-o", "loop", file, hostView).CombinedOutput()
	require.NoError(t, err, string(out))
	var cipherFiles []string
	require.NoError(t, filepath.WalkDir(filepath.Join(hostView, "cipher"), func(path string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && !strings.HasPrefix(d.Name(), "gocryptfs.") {
			cipherFiles = append(cipherFiles, path)
		}
		return err
	}))
	require.Len(t, cipherFiles, 1, "one file, one ciphertext file with an encrypted name")
	assert.NotContains(t, cipherFiles[0], "data.txt", "names are encrypted")
	f, err := os.OpenFile(cipherFiles[0], os.O_RDWR, 0)
	require.NoError(t, err)
	b := make([]byte, 1)
	_, err = f.ReadAt(b, 100)
	require.NoError(t, err)
	b[0] ^= 0x01
	_, err = f.WriteAt(b, 100)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	out, err = exec.Command("umount", hostView).CombinedOutput()
	require.NoError(t, err, string(out))

	require.NoError(t, g.Stage(ctx, file, key, staging))
	_, err = os.ReadFile(filepath.Join(staging, "data.txt"))
	require.Error(t, err, "a modified block fails GCM authentication")
	assert.True(t, errors.Is(err, syscall.EIO), "want EIO, got %v", err)
	require.NoError(t, g.Unstage(ctx, staging))
}

func TestGocryptfsNeverFormatsUsedDevice(t *testing.T) {
	testtier.Integration(t, "losetup, mkfs.ext4 and gocryptfs as root")
	ctx := context.Background()
	dir, file := volumeFile(t, 32*mib)
	// Something other than zeros in the first MiB (not a file system this driver wrote).
	f, err := os.OpenFile(file, os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte("someone else's data"), 512*1024)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	before, err := os.ReadFile(file)
	require.NoError(t, err)

	g := &unlock.Gocryptfs{WorkDir: filepath.Join(dir, "work")}
	err = g.Stage(ctx, file, newKey(t), filepath.Join(dir, "staging"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "mounting the volume's ext4 file system")
	after, err := os.ReadFile(file)
	require.NoError(t, err)
	assert.Equal(t, before, after, "a device with data is never formatted")
	assert.Empty(t, loopDevices(t, file))
}
