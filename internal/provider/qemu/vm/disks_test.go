package vm

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A real QEMU (the machine's firmware finds nothing to boot, which is all this needs):
// a volume's file is plugged as a SCSI disk carrying its name as serial number, twice is
// once, and unplugged the machine lets go of the file.
func TestPlugUnplug(t *testing.T) {
	if testing.Short() {
		t.Skip("starts QEMU and swtpm")
	}
	dir := t.TempDir()
	image := filepath.Join(dir, "disk.raw")
	require.NoError(t, os.WriteFile(image, make([]byte, 1<<20), 0o644))
	s := testSpec(filepath.Join(dir, "m"))
	s.Image, s.NIC, s.MemoryMiB, s.StateDiskBytes = image, nil, 512, 64<<20
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.NoError(t, Prepare(ctx, s))
	m, err := Start(ctx, s)
	require.NoError(t, err)
	t.Cleanup(m.Kill)

	vol := filepath.Join(dir, "vol.img")
	f, err := os.Create(vol)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(64<<20))
	require.NoError(t, f.Close())
	const name = "vol-0123456789abcdef0123456789abcdef"

	// The monitor's socket appears a moment after QEMU starts.
	require.Eventually(t, func() bool { _, err := os.Stat(m.QMPSocket()); return err == nil }, time.Minute, 100*time.Millisecond)
	require.NoError(t, m.Plug(ctx, name, vol))
	require.NoError(t, m.Plug(ctx, name, vol), "plugged already: nothing to do")
	assert.Equal(t, []string{vol}, blockFiles(t, m), "one block node, on the volume's file")
	serial := ""
	require.NoError(t, m.monitor(ctx, func(run runFunc) error {
		raw, err := run("qom-get", map[string]any{"path": "/machine/peripheral/" + name, "property": "serial"})
		if err == nil {
			var ans struct{ Return string }
			err = json.Unmarshal(raw, &ans)
			serial = ans.Return
		}
		return err
	}))
	assert.Equal(t, name, serial)

	require.NoError(t, m.Unplug(ctx, name))
	require.NoError(t, m.Unplug(ctx, name), "unplugged already: nothing to do")
	assert.Empty(t, blockFiles(t, m), "the machine let go of the volume's file")

	assert.ErrorContains(t, m.Plug(ctx, "Vol/../x", vol), "disk name")
	m.Kill()
	assert.ErrorContains(t, m.Plug(ctx, name, vol), "QEMU's monitor")
}

// blockFiles are the files of the machine's block nodes that the monitor added (named ones).
func blockFiles(t *testing.T, m *Machine) []string {
	t.Helper()
	var files []string
	require.NoError(t, m.monitor(context.Background(), func(run runFunc) error {
		raw, err := run("query-named-block-nodes", map[string]any{"flat": true})
		if err != nil {
			return err
		}
		var ans struct {
			Return []struct {
				NodeName string `json:"node-name"`
				File     string `json:"file"`
			}
		}
		if err := json.Unmarshal(raw, &ans); err != nil {
			return err
		}
		for _, n := range ans.Return {
			if n.NodeName == nodeName("vol-0123456789abcdef0123456789abcdef") {
				files = append(files, n.File)
			}
		}
		return nil
	}))
	return files
}
