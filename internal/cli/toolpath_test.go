package cli

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The hint after apply names commands the user's shell can run: a bare name only when it is
// on PATH outside the build output, else the path of the build output's binary.
func TestToolPath(t *testing.T) {
	exe, err := os.Executable()
	require.NoError(t, err)

	t.Setenv("PATH", t.TempDir())
	assert.Equal(t, exe, toolPath("constellation"), "not on PATH: the running CLI's path")
	assert.Equal(t, "no-such-tool", toolPath("no-such-tool"), "nowhere: the bare name")

	// On PATH elsewhere: the bare name.
	elsewhere := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(elsewhere, "kubectl"), []byte("#!/bin/sh\n"), 0o755))
	t.Setenv("PATH", elsewhere)
	assert.Equal(t, "kubectl", toolPath("kubectl"))
}

// The kubectl named after apply is the cluster version's own from the build output, even when
// another kubectl is on PATH; without one, toolPath's choice.
func TestKubectlFor(t *testing.T) {
	exe, err := os.Executable()
	require.NoError(t, err)
	output := filepath.Dir(filepath.Dir(exe))
	own := filepath.Join(output, "kube", "v9.99.0", "bin", "kubectl")
	require.NoError(t, os.MkdirAll(filepath.Dir(own), 0o755))
	t.Cleanup(func() { _ = os.RemoveAll(filepath.Join(output, "kube", "v9.99.0")) })
	require.NoError(t, os.WriteFile(own, []byte("#!/bin/sh\n"), 0o755))
	elsewhere := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(elsewhere, "kubectl"), []byte("#!/bin/sh\n"), 0o755))
	t.Setenv("PATH", elsewhere)

	assert.Equal(t, own, kubectlFor("v9.99.0"))
	assert.Equal(t, "kubectl", kubectlFor("v9.98.0"), "no build of that version: the one on PATH")
}
