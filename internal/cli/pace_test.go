package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/bootstrapper/bootstraptest"
	"github.com/openconstellation/constellation/internal/provider/local/cluster"
	"github.com/openconstellation/constellation/internal/state"
)

// A command given no --timeout waits longer for machines under emulation, and says so; a
// given --timeout and the sandboxes' clusters keep their bound.
func TestPacedTimeout(t *testing.T) {
	keys := bootstraptest.NewClusterKeys(t)
	workspace := func(t *testing.T, provider, accel string) string {
		ws := t.TempDir()
		st := recoveryState(keys, [2]string{"control-plane-0", ""})
		st.Provider = provider
		require.NoError(t, state.Write(filepath.Join(ws, state.FileName), st))
		dir := filepath.Join(ws, "mini")
		require.NoError(t, os.MkdirAll(dir, 0o700))
		spec := `{"machines": "qemu", "machineShape": {"accel": "` + accel + `"}}`
		require.NoError(t, os.WriteFile(filepath.Join(dir, cluster.SpecFile), []byte(spec), 0o600))
		return ws
	}
	command := func(args ...string) (*cobra.Command, *bytes.Buffer) {
		var timeout time.Duration
		cmd := &cobra.Command{}
		cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Minute, "")
		require.NoError(t, cmd.Flags().Parse(args))
		var stderr bytes.Buffer
		cmd.SetErr(&stderr)
		return cmd, &stderr
	}

	cmd, stderr := command()
	assert.Equal(t, 40*time.Minute, pacedTimeout(cmd, workspace(t, "qemu", "tcg"), 10*time.Minute))
	assert.Contains(t, stderr.String(), "waiting up to 40m0s")

	cmd, stderr = command("--timeout", "3m")
	assert.Equal(t, 3*time.Minute, pacedTimeout(cmd, workspace(t, "qemu", "tcg"), 3*time.Minute))
	assert.Empty(t, stderr.String())

	cmd, _ = command()
	assert.Equal(t, 10*time.Minute, pacedTimeout(cmd, workspace(t, "qemu", "kvm"), 10*time.Minute))
	cmd, _ = command()
	assert.Equal(t, 10*time.Minute, pacedTimeout(cmd, workspace(t, "local", "tcg"), 10*time.Minute), "sandboxes keep their defaults")
}
