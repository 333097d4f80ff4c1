package azurenode

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/openconstellation/constellation/internal/csidriver"
	"github.com/openconstellation/constellation/internal/provider/azure/azuremeta"
)

// lunDisks is csidriver.Devices on an Azure VM. The controller attaches a volume's managed
// disk under the volume's id as its name (azurevolumes); IMDS lists the VM's data disks with
// their LUNs, and the node finds the disk at that LUN in sysfs. IMDS is the host's: a forged
// answer can point a volume at another disk, which the volume's key does not open
// (unlock.LUKS2 never formats a disk with anything on it), never at the state disk.
type lunDisks struct {
	imds interface {
		Instance(context.Context) (azuremeta.Instance, error)
	}
	// sysBlock is the kernel's list of block devices (/sys/block).
	sysBlock string
	// wait bounds how long an attached disk may take to show in IMDS and in sysfs.
	wait time.Duration
	log  *slog.Logger
}

// Device implements csidriver.Devices.
func (d *lunDisks) Device(ctx context.Context, id string) (string, error) {
	if !csidriver.ValidID(id) {
		return "", fmt.Errorf("volume id %q: not a volume id: %w", id, csidriver.ErrNotAttached)
	}
	ctx, cancel := context.WithTimeout(ctx, d.wait)
	defer cancel()
	lastReport := time.Now()
	for {
		dev, done, err := d.find(ctx, id)
		if done {
			return dev, err
		}
		if time.Since(lastReport) >= 5*time.Second {
			d.log.Info("waiting for the volume's disk", "volume", id, "status", err.Error())
			lastReport = time.Now()
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("volume %s: waited %s: %w", id, d.wait, err)
		case <-time.After(time.Second):
		}
	}
}

// find looks for the volume's disk once; done says whether waiting could change the answer.
func (d *lunDisks) find(ctx context.Context, id string) (dev string, done bool, err error) {
	inst, err := d.imds.Instance(ctx)
	if err != nil {
		return "", false, err
	}
	lun, listed := -1, false
	for _, disk := range inst.DataDisks {
		if disk.Name == id {
			lun, listed = disk.LUN, true
		}
	}
	if !listed {
		// IMDS may lag an attach by seconds.
		return "", false, fmt.Errorf("IMDS lists no data disk of that name on this VM: %w", csidriver.ErrNotAttached)
	}
	if lun < azuremeta.FirstVolumeLUN {
		return "", true, fmt.Errorf("volume %s: IMDS lists it at LUN %d, the state disk's: refusing it", id, lun)
	}
	dev, err = findLUN(d.sysBlock, lun)
	if errors.Is(err, ErrNoLUN) {
		return "", false, err // the kernel's SCSI scan has not found it yet
	}
	return dev, true, err
}
