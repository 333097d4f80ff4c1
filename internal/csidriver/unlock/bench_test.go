package unlock_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/csidriver/unlock"
	"github.com/openconstellation/constellation/internal/statedisk"
	"github.com/openconstellation/constellation/internal/testtier"
)

// BenchmarkStage is the node's share of a moved pod's start: staging a volume that exists
// (attach a loop device, mount ext4, unlock and mount the gocryptfs tree), then unstaging it.
func BenchmarkStage(b *testing.B) {
	testtier.Integration(b, "losetup, mkfs.ext4 and gocryptfs as root")
	ctx := context.Background()
	dir, file := volumeFile(b, 256*mib)
	g := &unlock.Gocryptfs{WorkDir: filepath.Join(dir, "work")}
	staging := filepath.Join(dir, "staging")
	key := newKey(b)
	require.NoError(b, g.Stage(ctx, file, key, staging)) // formats the new volume
	require.NoError(b, g.Unstage(ctx, staging))
	b.ResetTimer()
	for range b.N {
		require.NoError(b, g.Stage(ctx, file, key, staging))
		require.NoError(b, g.Unstage(ctx, staging))
	}
}

// BenchmarkWrite compares what a pod writes to an encrypted volume with what the node writes
// to its own state storage: 64 MiB in 1 MiB writes, then fsync, through gocryptfs on ext4 in
// a loop-mounted file (a volume) and through gocryptfs on the host's directory (the node's
// state storage, statedisk.Gocryptfs as the local provider uses it).
func BenchmarkWrite(b *testing.B) {
	testtier.Integration(b, "losetup, mkfs.ext4 and gocryptfs as root")
	ctx := context.Background()
	const size = 64 * mib
	b.Run("volume", func(b *testing.B) {
		dir, file := volumeFile(b, 256*mib)
		g := &unlock.Gocryptfs{WorkDir: filepath.Join(dir, "work")}
		staging := filepath.Join(dir, "staging")
		require.NoError(b, g.Stage(ctx, file, newKey(b), staging))
		b.Cleanup(func() { _ = g.Unstage(ctx, staging) })
		writeBench(b, staging, size)
	})
	b.Run("state-storage", func(b *testing.B) {
		dir := b.TempDir()
		s := &statedisk.Gocryptfs{Dir: filepath.Join(dir, "state"), MountPoint: filepath.Join(dir, "mnt")}
		key := newKey(b)
		require.NoError(b, s.Create(ctx, key))
		require.NoError(b, s.Unlock(ctx, key))
		b.Cleanup(func() { _ = s.Lock(ctx) })
		writeBench(b, s.MountPoint, size)
	})
}

func writeBench(b *testing.B, dir string, size int) {
	b.SetBytes(int64(size))
	b.ResetTimer()
	for i := range b.N {
		path := filepath.Join(dir, "bench")
		require.NoError(b, fill(path, size))
		b.StopTimer()
		require.NoError(b, os.Remove(path))
		if i < b.N-1 {
			b.StartTimer()
		}
	}
}
