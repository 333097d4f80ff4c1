package azurenode

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeSysfs lays out /sys/block and the VMBus devices behind it as Azure's kernel shows
// them: disks name "host:channel:target:lun" under a storvsc controller whose device_id says
// which controller it is.
type fakeSysfs struct{ root string }

func (f fakeSysfs) disk(t *testing.T, name, controllerID, addr string) {
	t.Helper()
	ctrl := filepath.Join(f.root, "devices", "vmbus", controllerID)
	dev := filepath.Join(ctrl, "host", "target", addr)
	require.NoError(t, os.MkdirAll(dev, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(ctrl, "device_id"), []byte("{"+controllerID+"}\n"), 0o644))
	blk := filepath.Join(f.root, "block", name)
	require.NoError(t, os.MkdirAll(blk, 0o755))
	require.NoError(t, os.Symlink(dev, filepath.Join(blk, "device")))
}

func TestFindLUN(t *testing.T) {
	f := fakeSysfs{root: t.TempDir()}
	const osCtrl, dataCtrl = "00000000-0000-8899-0000-000000000000", "00000000-0001-8899-0000-000000000000"
	f.disk(t, "sda", osCtrl, "0:0:0:0")   // OS disk
	f.disk(t, "sdb", osCtrl, "0:0:0:1")   // resource disk
	f.disk(t, "sdc", dataCtrl, "1:0:0:0") // LUN 0: the state disk
	f.disk(t, "sdd", dataCtrl, "1:0:0:3")
	block := filepath.Join(f.root, "block")

	dev, err := findLUN(block, 0)
	require.NoError(t, err)
	assert.Equal(t, "/dev/sdc", dev, "LUN 0 of the data disks, not the OS disk at 0:0:0:0")
	dev, err = findLUN(block, 3)
	require.NoError(t, err)
	assert.Equal(t, "/dev/sdd", dev)
	_, err = findLUN(block, 1)
	assert.ErrorIs(t, err, ErrNoLUN, "the resource disk's LUN 1 is not a data disk")

	_, err = waitLUN(t.Context(), block, 7, 50*time.Millisecond)
	assert.ErrorContains(t, err, "LUN 7: no data disk at the LUN")

	// Two answers (a second controller claiming to be the data disks'): refused.
	f.disk(t, "sde", "00000000-0001-aaaa-0000-000000000000", "2:0:0:0")
	_, err = findLUN(block, 0)
	assert.ErrorContains(t, err, "LUN 0: 2 disks answer (/dev/sdc, /dev/sde): refusing to guess")
}
