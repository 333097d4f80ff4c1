package swtpm_test

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/pkg/attestation/qemu"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/swtpm"
)

func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "swtpm")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// TestRestartKeepsAK: the TPM state survives a restart, so a node's AK (and the certificate
// the provider issued for it) stays valid; Stop leaves no process behind.
func TestRestartKeepsAK(t *testing.T) {
	integration(t)
	dir := shortTempDir(t)
	ctx := context.Background()
	akOf := func() ([]byte, int) {
		proc, err := swtpm.Start(ctx, swtpm.Options{StateDir: dir})
		require.NoError(t, err)
		t.Cleanup(func() { _ = proc.Stop() })
		tpm, err := proc.Open(ctx)
		require.NoError(t, err)
		iss, err := qemu.NewIssuer(tpm, nil, nil)
		require.NoError(t, err)
		ak := iss.AKPublic()
		require.NoError(t, tpm.Close())
		require.NoError(t, proc.Stop())
		return ak, proc.Pid()
	}
	first, pid := akOf()
	assert.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH, "swtpm exited after Stop")
	second, _ := akOf()
	assert.Equal(t, first, second)
	_, err := os.Stat(filepath.Join(dir, "tpm.sock"))
	assert.True(t, os.IsNotExist(err), "sockets removed")
}

func TestStartErrors(t *testing.T) {
	ctx := context.Background()
	_, err := swtpm.Start(ctx, swtpm.Options{})
	assert.ErrorContains(t, err, "no state directory")

	_, err = swtpm.Start(ctx, swtpm.Options{StateDir: shortTempDir(t), Binary: "/nonexistent/swtpm"})
	assert.ErrorContains(t, err, "starting /nonexistent/swtpm")

	// A binary that exits at once is reported with swtpm's log, not as a timeout.
	_, err = swtpm.Start(ctx, swtpm.Options{StateDir: shortTempDir(t), Binary: "false"})
	assert.ErrorContains(t, err, "exited during start-up")

	// A comma would split swtpm's dir=... option; refused before swtpm runs, with the path.
	_, err = swtpm.Start(ctx, swtpm.Options{StateDir: filepath.Join(shortTempDir(t), "a,b")})
	assert.ErrorContains(t, err, `path "`)
	assert.ErrorContains(t, err, "contains a comma")
}

// TestExited: a swtpm that dies on its own (a failed TPM chip) is noticed through Exited,
// with how it ended; Stop afterwards is harmless.
func TestExited(t *testing.T) {
	integration(t)
	proc, err := swtpm.Start(context.Background(), swtpm.Options{StateDir: shortTempDir(t)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = proc.Stop() })
	select {
	case <-proc.Exited():
		t.Fatal("Exited is closed while swtpm runs")
	default:
	}
	require.NoError(t, syscall.Kill(proc.Pid(), syscall.SIGKILL))
	select {
	case <-proc.Exited():
	case <-time.After(10 * time.Second):
		t.Fatal("Exited is not closed 10 s after swtpm was killed")
	}
	assert.ErrorContains(t, proc.ExitErr(), "signal: killed")
	assert.NoError(t, proc.Stop())
}

// integration skips t in the unit tier (go test -short): it runs a real swtpm.
func integration(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("integration tier: runs swtpm")
	}
}
