package nodeos

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBindFileReadOnly: the event log the provider wrote is readable at the node's path, and
// the node's software cannot write through that path (root included: the mount is read-only).
func TestBindFileReadOnly(t *testing.T) {
	dir := privateTempDir(t)
	src, dst := filepath.Join(dir, "eventlog"), filepath.Join(dir, "bound")
	require.NoError(t, os.WriteFile(src, []byte("the provider's log"), 0o644))

	require.NoError(t, bindFileReadOnly(src, dst))
	read, err := os.ReadFile(dst)
	require.NoError(t, err)
	assert.Equal(t, "the provider's log", string(read))
	err = os.WriteFile(dst, []byte("a forged log"), 0o644)
	assert.True(t, errors.Is(err, syscall.EROFS), "writing through the node's path: %v", err)
	got, err := os.ReadFile(src)
	require.NoError(t, err)
	assert.Equal(t, "the provider's log", string(got))
}

// privateTempDir returns a temporary directory that is a private mount of its own: nothing
// mounted below it propagates to or from the host's other mount namespaces. Every mount below
// it is detached when the test ends, whatever the test did.
//
// The mounts are made in the test process's own mount namespace, not in one a single thread
// unshared: a Go program's threads are not all in the namespace a thread moves to, so one
// goroutine would not see another's mounts (a thread of a test that did that may stay behind
// in its namespace; requireOneMountNamespace checks).
func privateTempDir(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("mounts")
	}
	// Needs root for the mounts; CI and make test run as root.
	require.Zero(t, os.Geteuid(), "needs root for mounts")
	requireOneMountNamespace(t)
	dir := t.TempDir()
	// Registered after TempDir's cleanup, so it runs first: unmount, then remove.
	t.Cleanup(func() { unmountBelow(t, dir) })
	require.NoError(t, syscall.Mount(dir, dir, "", syscall.MS_BIND, ""))
	require.NoError(t, syscall.Mount("", dir, "", syscall.MS_PRIVATE|syscall.MS_REC, ""))
	return dir
}

// requireOneMountNamespace fails the test unless every thread of the process is in the same
// mount namespace.
func requireOneMountNamespace(t *testing.T) {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	require.NoError(t, err)
	namespaces := map[string]bool{}
	for _, task := range tasks {
		ns, err := os.Readlink(filepath.Join("/proc/self/task", task.Name(), "ns", "mnt"))
		if err == nil { // a thread that ended meanwhile has no ns link
			namespaces[ns] = true
		}
	}
	require.Len(t, namespaces, 1, "the test process's threads are in several mount namespaces: %v", namespaces)
}
