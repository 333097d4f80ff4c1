// Package e2e holds end-to-end tests that run the constellation binary against real
// components (swtpm processes, loopback networking).
package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// buildCLI builds the constellation binary once for the test.
func buildCLI(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "constellation")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/openconstellation/constellation/cmd/constellation").CombinedOutput()
	require.NoError(t, err, "%s", out)
	return bin
}

// TestMiniUpPreview runs `mini up` (today: attested handshakes between swtpm-backed nodes)
// and `mini down`, and checks that the genuine node is admitted, the modified one rejected,
// and that nothing is left behind.
func TestMiniUpPreview(t *testing.T) {
	bin := buildCLI(t)
	ws := t.TempDir()
	t.Cleanup(func() { _ = exec.Command(bin, "mini", "down", "-C", ws).Run() })

	out, err := exec.Command(bin, "mini", "up", "-C", ws).CombinedOutput()
	require.NoError(t, err, "%s", out)
	text := string(out)
	assert.Contains(t, text, `node-0 about node-1: VERIFIED (variant qemu-vtpm, reference set "local-image", AK certified`)
	assert.Contains(t, text, `node-1 about node-0: VERIFIED`)
	assert.Contains(t, text, "node-0 about node-2: REJECTED")
	assert.Contains(t, text, "PCR 11: expected")
	assert.Contains(t, text, "node-2 about node-0: REJECTED: attested handshake: peer aborted")

	out, err = exec.Command(bin, "mini", "up", "-C", ws).CombinedOutput()
	require.Error(t, err, "a second mini up must refuse")
	assert.Contains(t, string(out), "already up")

	// Every process mini up started has exited: no swtpm refers to the workspace.
	assert.Empty(t, processesMentioning(t, ws))

	out, err = exec.Command(bin, "mini", "down", "-C", ws).CombinedOutput()
	require.NoError(t, err, "%s", out)
	_, err = os.Stat(filepath.Join(ws, "mini"))
	assert.True(t, os.IsNotExist(err), "mini down removes the workspace files")
}

func processesMentioning(t *testing.T, s string) []string {
	t.Helper()
	var found []string
	entries, err := os.ReadDir("/proc")
	require.NoError(t, err)
	for _, e := range entries {
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmdline), s) {
			found = append(found, e.Name()+": "+strings.ReplaceAll(string(cmdline), "\x00", " "))
		}
	}
	return found
}
