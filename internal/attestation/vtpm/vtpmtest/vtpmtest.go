// Package vtpmtest provides TPMs for tests: the go-tpm-tools simulator (in-process, fast, one
// per process at a time) and real swtpm processes. Only tests import it, so the cgo simulator
// never ends up in a production binary.
package vtpmtest

import (
	"context"
	"os"
	"testing"

	"github.com/google/go-tpm-tools/simulator"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/attestation/vtpm"
	"github.com/openconstellation/constellation/internal/swtpm"
)

// Simulator returns a fresh simulator TPM, closed when the test ends. The simulator is a
// process-wide singleton: tests using it must not run in parallel.
func Simulator(t testing.TB) *vtpm.TPM {
	t.Helper()
	sim, err := simulator.Get()
	require.NoError(t, err)
	tpm := vtpm.New(sim, "simulator")
	t.Cleanup(func() { _ = tpm.Close() })
	return tpm
}

// SimulatorFixedSeed returns a simulator whose seeds, and so whose attestation key, are the
// same in every process: fuzz workers (separate processes) then share the AK of the seed
// corpus. Insecure by design; tests only.
func SimulatorFixedSeed(t testing.TB, seed int64) *vtpm.TPM {
	t.Helper()
	sim, err := simulator.GetWithFixedSeedInsecure(seed)
	require.NoError(t, err)
	tpm := vtpm.New(sim, "simulator")
	t.Cleanup(func() { _ = tpm.Close() })
	return tpm
}

// Swtpm starts a swtpm process and returns an open connection to it; both end with the test.
func Swtpm(t testing.TB) (*vtpm.TPM, *swtpm.Process) {
	t.Helper()
	proc := SwtpmProcess(t)
	tpm, err := proc.Open(context.Background())
	require.NoError(t, err)
	t.Cleanup(func() { _ = tpm.Close() })
	return tpm, proc
}

// SwtpmProcess starts a swtpm process, stopped when the test ends, without connecting to it:
// for code that opens the TPM per use (swtpm serves one connection at a time).
func SwtpmProcess(t testing.TB) *swtpm.Process {
	t.Helper()
	// os.MkdirTemp, not t.TempDir: test names can push a socket path past 107 bytes.
	dir, err := os.MkdirTemp("", "swtpm")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	proc, err := swtpm.Start(context.Background(), swtpm.Options{StateDir: dir})
	require.NoError(t, err)
	t.Cleanup(func() { _ = proc.Stop() })
	return proc
}
