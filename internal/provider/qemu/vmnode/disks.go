package vmnode

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/openconstellation/constellation/internal/csidriver"
)

// machineDisks is csidriver.Devices on a machine: the provider's volume API says whether a
// volume is attached to this node (and plugs its disk into the machine when it is), and the
// node finds the disk itself, by the SCSI serial number the provider gives it: the volume's
// id (internal/provider/qemu/vm "Plug"). The host's answer names a file on the host, which
// means nothing here; what the node opens is decided by the node, and whether it is the
// volume by the volume's key (unlock.LUKS2).
type machineDisks struct {
	provider csidriver.Devices
	// sysBlock is the kernel's list of block devices (/sys/block).
	sysBlock string
	// wait bounds how long a plugged disk may take to appear (the kernel's SCSI scan, udev).
	wait time.Duration
	log  *slog.Logger
}

// Device implements csidriver.Devices.
func (d *machineDisks) Device(ctx context.Context, id string) (string, error) {
	if _, err := d.provider.Device(ctx, id); err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, d.wait)
	defer cancel()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	lastReport := time.Now()
	for {
		name, err := diskWithSerial(d.sysBlock, id)
		if err != nil || name != "" {
			return "/dev/" + name, err
		}
		if time.Since(lastReport) >= 5*time.Second {
			d.log.Info("waiting for the volume's disk to appear", "volume", id)
			lastReport = time.Now()
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("volume %s is attached, but no disk with its serial number appeared on this machine: %w", id, ctx.Err())
		case <-tick.C:
		}
	}
}

// diskWithSerial returns the name of the block device in sysBlock whose SCSI unit serial
// number (VPD page 0x80) is serial, or "" if there is none. Two disks with that serial are
// an error: the node does not guess which one the host meant.
func diskWithSerial(sysBlock, serial string) (string, error) {
	entries, err := os.ReadDir(sysBlock)
	if err != nil {
		return "", fmt.Errorf("listing block devices: %w", err)
	}
	var found []string
	for _, e := range entries {
		raw, err := os.ReadFile(filepath.Join(sysBlock, e.Name(), "device", "vpd_pg80"))
		if errors.Is(err, os.ErrNotExist) {
			continue // not a SCSI disk, or one without a serial
		}
		if err != nil {
			return "", fmt.Errorf("reading the serial number of %s: %w", e.Name(), err)
		}
		if s, err := ParseVPDSerial(raw); err == nil && s == serial {
			found = append(found, e.Name())
		}
	}
	switch len(found) {
	case 0:
		return "", nil
	case 1:
		return found[0], nil
	default:
		return "", fmt.Errorf("disks %s all carry the serial number %s: refusing to pick one", strings.Join(found, ", "), serial)
	}
}

// ParseVPDSerial returns the serial number of a SCSI Unit Serial Number VPD page (0x80,
// SPC-4 7.8.18), as the kernel exports it (vpd_pg80): a 4-byte header (page code at byte 1,
// length at bytes 2-3), then the serial in ASCII, which devices may pad with spaces.
func ParseVPDSerial(page []byte) (string, error) {
	if len(page) < 4 {
		return "", fmt.Errorf("VPD page of %d bytes: shorter than its header", len(page))
	}
	if page[1] != 0x80 {
		return "", fmt.Errorf("VPD page 0x%02x: want the unit serial number page 0x80", page[1])
	}
	n := int(page[2])<<8 | int(page[3])
	if 4+n > len(page) {
		return "", fmt.Errorf("VPD page 0x80 declares %d bytes, has %d", n, len(page)-4)
	}
	serial := strings.Trim(string(page[4:4+n]), " \x00")
	for _, c := range []byte(serial) {
		if c < 0x20 || c > 0x7e {
			return "", fmt.Errorf("VPD page 0x80: serial number holds byte 0x%02x, not printable ASCII", c)
		}
	}
	return serial, nil
}
