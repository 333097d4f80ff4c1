package azurenode

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ErrNoLUN is wrapped when no data disk answers at a LUN.
var ErrNoLUN = errors.New("no data disk at the LUN")

// dataDiskController is how Azure's VMBus SCSI controller of data disks names itself: its
// device_id is "{00000000-0001-...}" ("scsi1"; the OS and resource disks' is
// "{00000000-0000-...}"), as Azure's own udev rules (66-azure-storage.rules) tell them apart.
const dataDiskController = "00000000-0001-"

// findLUN returns the block device (/dev/sdX) of the data disk at lun, from sysfs (sysBlock:
// /sys/block): a SCSI disk whose address H:C:T:L has L = lun and whose VMBus controller is
// the data disks'. Exactly one must answer.
func findLUN(sysBlock string, lun int) (string, error) {
	entries, err := os.ReadDir(sysBlock)
	if err != nil {
		return "", err
	}
	var found []string
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "sd") {
			continue
		}
		dev, err := filepath.EvalSymlinks(filepath.Join(sysBlock, e.Name(), "device"))
		if err != nil {
			continue
		}
		if l, ok := scsiLUN(filepath.Base(dev)); !ok || l != lun || !onDataController(dev) {
			continue
		}
		found = append(found, "/dev/"+e.Name())
	}
	switch len(found) {
	case 0:
		return "", fmt.Errorf("LUN %d: %w (data disks on NVMe are not supported yet)", lun, ErrNoLUN)
	case 1:
		return found[0], nil
	default:
		return "", fmt.Errorf("LUN %d: %d disks answer (%s): refusing to guess", lun, len(found), strings.Join(found, ", "))
	}
}

// scsiLUN parses a SCSI address "H:C:T:L" and returns L.
func scsiLUN(addr string) (int, bool) {
	parts := strings.Split(addr, ":")
	if len(parts) != 4 {
		return 0, false
	}
	for _, p := range parts {
		if _, err := strconv.Atoi(p); err != nil {
			return 0, false
		}
	}
	l, _ := strconv.Atoi(parts[3])
	return l, true
}

// onDataController says whether the SCSI device at dev hangs off the data disks' VMBus
// controller: some parent directory has a device_id naming it.
func onDataController(dev string) bool {
	for dir := filepath.Dir(dev); dir != "/" && dir != "."; dir = filepath.Dir(dir) {
		id, err := os.ReadFile(filepath.Join(dir, "device_id"))
		if err == nil {
			return strings.HasPrefix(strings.Trim(strings.TrimSpace(string(id)), "{}"), dataDiskController)
		}
	}
	return false
}

// waitLUN waits up to wait for the data disk at lun (Azure attaches it while the VM boots),
// polling every second.
func waitLUN(ctx context.Context, sysBlock string, lun int, wait time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for {
		dev, err := findLUN(sysBlock, lun)
		if err == nil || !errors.Is(err, ErrNoLUN) {
			return dev, err
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("waited %s: %w", wait, err)
		case <-time.After(time.Second):
		}
	}
}
