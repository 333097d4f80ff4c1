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

	"github.com/openconstellation/constellation/pkg/attestation/variant"

	"sigs.k8s.io/yaml"
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
	require.NoError(c.t, os.WriteFile(filepath.Join(c.dir, ts, "reference-sets.yaml"), yamlToJSON(c.t, content), 0o644))
	require.NoError(c.t, os.Symlink(ts, filepath.Join(c.dir, "..data_tmp")))
	require.NoError(c.t, os.Rename(filepath.Join(c.dir, "..data_tmp"), filepath.Join(c.dir, "..data")))
	link := filepath.Join(c.dir, "reference-sets.yaml")
	if _, err := os.Lstat(link); os.IsNotExist(err) {
		require.NoError(c.t, os.Symlink("..data/reference-sets.yaml", link))
	}
}

// yamlToJSON converts the readable YAML the tests write into the JSON the ConfigMap carries.
func yamlToJSON(t *testing.T, y string) []byte {
	t.Helper()
	js, err := yaml.YAMLToJSON([]byte(y))
	require.NoError(t, err)
	return js
}

// setsYAML renders valid sets (PCRs 0..14 enforced), told apart by PCR 11.
func setsYAML(names ...string) string {
	out := ""
	for i, n := range names {
		out += fmt.Sprintf("- name: %s\n  measurements:\n%s", n, registersYAML(map[uint32]string{11: fmt.Sprintf("%q", hexOf(byte(i+1)))}))
	}
	return out
}

// registersYAML renders PCRs 0..14 (zero unless given), then any other register given.
func registersYAML(values map[uint32]string) string {
	out := ""
	for i := range uint32(24) {
		val, ok := values[i]
		switch {
		case ok && val == "":
			continue // left out
		case ok:
		case i < 15:
			val = fmt.Sprintf("%q", hexOf(0))
		default:
			continue
		}
		out += fmt.Sprintf("    \"%d\": %s\n", i, val)
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

	// Attack: whoever can edit the ConfigMap publishes a set that admits more than the
	// image. Each is refused, naming the register, and the sets in force stay.
	zero := fmt.Sprintf("%q", hexOf(0))
	for name, tc := range map[string]struct{ registers, wantErr string }{
		"only PCR 0":         {"    \"0\": " + zero + "\n", "missing PCR 1, PCR 2"},
		"only PCR 16 and 23": {"    \"16\": " + zero + "\n    \"23\": " + zero + "\n", "PCR 16, PCR 23 not measured by the image"},
		"PCR 11 warn-only":   {registersYAML(map[uint32]string{11: "{expected: " + zero + ", warnOnly: true}"}), "PCR 11 warn-only"},
		"PCR 15 pinned":      {registersYAML(map[uint32]string{15: zero}), "PCR 15 must not be in a reference set"},
	} {
		cm.publish(setsYAML("v2") + "- name: loose\n  measurements:\n" + tc.registers)
		err := <-reloads
		require.Error(t, err, name)
		assert.ErrorContains(t, err, `reference set "loose": `+tc.wantErr, name)
		assert.Equal(t, []string{"v2"}, names(), name)
	}
}

func TestWatcherPollsWithoutEvents(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sets.yaml")
	require.NoError(t, os.WriteFile(path, yamlToJSON(t, setsYAML("v1")), 0o644))
	active, err := NewActive(variant.QEMUVTPM, ReferenceSets{{Name: "bootstrap", Measurements: image(map[uint32][]byte{11: digest(9)})}})
	require.NoError(t, err)
	w := &Watcher{Path: path, Active: active}
	assert.True(t, w.Reload())
	assert.Equal(t, "v1", active.Load()[0].Name)
	assert.False(t, w.Reload(), "unchanged content is not reloaded")
	require.NoError(t, os.Remove(path))
	assert.False(t, w.Reload(), "a missing file keeps the sets in force")
	assert.Equal(t, "v1", active.Load()[0].Name)
}
