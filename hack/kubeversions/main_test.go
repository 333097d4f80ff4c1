package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/kubeversion"
)

func TestSelected(t *testing.T) {
	kubeDir := t.TempDir()
	all, err := selected("", kubeDir)
	require.NoError(t, err)
	assert.Equal(t, kubeversion.Releases(), all)
	def, err := selected("default", kubeDir)
	require.NoError(t, err)
	require.Len(t, def, 1)
	assert.Equal(t, kubeversion.Default, def[0].Kubernetes)
	two, err := selected("v1.34.4, v1.35.4", kubeDir)
	require.NoError(t, err)
	assert.Len(t, two, 2)
	_, err = selected("v1.20.0", kubeDir)
	assert.ErrorContains(t, err, "not supported")

	// make release: its own version and the ones built before, each once, oldest first.
	newest := kubeversion.Releases()[len(kubeversion.Releases())-1].Kubernetes
	built, err := selected(newest+",built", kubeDir)
	require.NoError(t, err)
	assert.Equal(t, []string{newest}, versions(built), "nothing built yet")
	require.NoError(t, os.MkdirAll(filepath.Join(kubeDir, kubeversion.Default, "bin"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(kubeDir, "v1.20.0", "bin"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(kubeDir, "v1.20.0", "bin", ".stamp"), nil, 0o644))
	built, err = selected("default,built", kubeDir)
	require.NoError(t, err)
	assert.Equal(t, []string{kubeversion.Default}, versions(built), "an unfinished build and an unsupported version do not count")
	require.NoError(t, os.WriteFile(filepath.Join(kubeDir, kubeversion.Default, "bin", ".stamp"), nil, 0o644))
	built, err = selected(newest+" built default", kubeDir)
	require.NoError(t, err)
	want := []string{kubeversion.Default}
	if newest != kubeversion.Default {
		want = append(want, newest)
	}
	assert.Equal(t, want, versions(built))
	_, err = selected(" , ", kubeDir)
	assert.ErrorContains(t, err, "names no version")
}

func versions(rs []kubeversion.Release) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Kubernetes)
	}
	return out
}
