package measurements

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/attestation/variant"
)

// configMapDir mimics how kubelet publishes a ConfigMap volume: the data lives in a
// timestamped directory, "..data" links to it, and the file name links into "..data". An
// update writes a new directory and renames a new "..data" link over the old one.
type configMapDir struct {
	t   *testing.T
	dir string
	gen int
}

func (c *configMapDir) publish(content string) {
	c.t.Helper()
	c.gen++
	ts := fmt.Sprintf("..2026_11_22_%06d", c.gen)
	require.NoError(c.t, os.Mkdir(filepath.Join(c.dir, ts), 0o755))
	require.NoError(c.t, os.WriteFile(filepath.Join(c.dir, ts, "reference-sets.yaml"), []byte(content), 0o644))
	require.NoError(c.t, os.Symlink(ts, filepath.Join(c.dir, "..data_tmp")))
	require.NoError(c.t, os.Rename(filepath.Join(c.dir, "..data_tmp"), filepath.Join(c.dir, "..data")))
	link := filepath.Join(c.dir, "reference-sets.yaml")
	if _, err := os.Lstat(link); os.IsNotExist(err) {
		require.NoError(c.t, os.Symlink("..data/reference-sets.yaml", link))
	}
}

func setsYAML(names ...string) string {
	out := ""
	for i, n := range names {
		out += fmt.Sprintf("- name: %s\n  measurements:\n    \"4\": \"%s\"\n", n, hexOf(byte(i+1)))
	}
	return out
}

func TestWatcherFollowsConfigMapUpdates(t *testing.T) {
	cm := &configMapDir{t: t, dir: t.TempDir()}
	cm.publish(setsYAML("v1"))
	path := filepath.Join(cm.dir, "reference-sets.yaml")
	initial, err := ReadFile(path, variant.QEMUVTPM)
	require.NoError(t, err)
	active, err := NewActive(variant.QEMUVTPM, initial)
	require.NoError(t, err)

	reloads := make(chan error, 10)
	w := &Watcher{Path: path, Active: active, PollInterval: time.Hour, OnReload: func(_ ReferenceSets, err error) { reloads <- err }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	require.NoError(t, <-reloads) // the initial read

	names := func() []string {
		var out []string
		for _, s := range active.Load() {
			out = append(out, s.Name)
		}
		return out
	}
	// Upgrade: add v2, then retire v1. Only filesystem events drive this (poll is an hour).
	cm.publish(setsYAML("v1", "v2"))
	require.NoError(t, <-reloads)
	assert.Equal(t, []string{"v1", "v2"}, names())
	cm.publish(setsYAML("v2"))
	require.NoError(t, <-reloads)
	assert.Equal(t, []string{"v2"}, names())

	// A broken update is reported and the sets in force stay.
	cm.publish("- name: broken\n  measurements:\n    \"99\": zz\n")
	require.Error(t, <-reloads)
	assert.Equal(t, []string{"v2"}, names())
	cm.publish("[]")
	assert.ErrorContains(t, <-reloads, "no reference-value set configured")
	assert.Equal(t, []string{"v2"}, names())
}

func TestWatcherPollsWithoutEvents(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sets.yaml")
	require.NoError(t, os.WriteFile(path, []byte(setsYAML("v1")), 0o644))
	active, err := NewActive(variant.QEMUVTPM, ReferenceSets{{Name: "bootstrap", Measurements: M{4: {Expected: digest(9)}}}})
	require.NoError(t, err)
	w := &Watcher{Path: path, Active: active}
	assert.True(t, w.Reload())
	assert.Equal(t, "v1", active.Load()[0].Name)
	assert.False(t, w.Reload(), "unchanged content is not reloaded")
	require.NoError(t, os.Remove(path))
	assert.False(t, w.Reload(), "a missing file keeps the sets in force")
	assert.Equal(t, "v1", active.Load()[0].Name)
}
