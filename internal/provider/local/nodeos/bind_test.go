package nodeos

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBindFileReadOnly: the event log the provider wrote is readable at the node's path, and
// the node's software cannot write through that path (root included: the mount is read-only).
func TestBindFileReadOnly(t *testing.T) {
	if testing.Short() {
		t.Skip("mounts in a new mount namespace")
	}
	// Needs root for a mount namespace; CI and make test run as root.
	require.Zero(t, os.Geteuid(), "needs root for a mount namespace")
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "eventlog"), filepath.Join(dir, "bound")
	require.NoError(t, os.WriteFile(src, []byte("the provider's log"), 0o644))

	type result struct {
		read     []byte
		writeErr error
		err      error
	}
	done := make(chan result)
	// A thread of its own in a mount namespace of its own: the thread is never returned to
	// the Go scheduler (no UnlockOSThread), so it ends with the goroutine, namespace and all.
	go func() {
		runtime.LockOSThread()
		var r result
		defer func() { done <- r }()
		if r.err = syscall.Unshare(syscall.CLONE_NEWNS); r.err != nil {
			return
		}
		if r.err = syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); r.err != nil {
			return
		}
		if r.err = bindFileReadOnly(src, dst); r.err != nil {
			return
		}
		r.read, r.err = os.ReadFile(dst)
		r.writeErr = os.WriteFile(dst, []byte("a forged log"), 0o644)
	}()
	r := <-done
	require.NoError(t, r.err)
	assert.Equal(t, "the provider's log", string(r.read))
	assert.True(t, errors.Is(r.writeErr, syscall.EROFS), "writing through the node's path: %v", r.writeErr)
	got, err := os.ReadFile(src)
	require.NoError(t, err)
	assert.Equal(t, "the provider's log", string(got))
}
