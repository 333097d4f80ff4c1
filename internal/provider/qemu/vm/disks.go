package vm

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/digitalocean/go-qemu/qmp"
)

// A running machine's extra disks (the encrypted volumes its pods use) are SCSI disks on
// the machine's virtio-scsi controller (VolumeBus), plugged and unplugged through QEMU's
// monitor (QMP). The controller is part of every machine's shape, so the firmware sees the
// same machine with or without volumes; disks are plugged only into a running machine, after
// its firmware is done, so no volume ever changes a measured register
// (docs/qemu-provider.md "Volumes").
//
// A disk carries its name as its SCSI serial number (VPD page 0x80), which is how the
// machine's OS finds it: the host names a disk, the node checks what it opens with it.

// VolumeBus is the SCSI bus of the machine's volume controller.
const VolumeBus = "volumes.0"

// diskNamePattern is what a disk may be named: a device id QEMU accepts, short enough for a
// SCSI serial (QEMU allows 36 characters).
var diskNamePattern = regexp.MustCompile(`^[a-z][a-z0-9-]{0,35}$`)

// nodeName is the block node of disk name: QEMU's node names are at most 31 characters.
func nodeName(name string) string {
	n := "d" + strings.ReplaceAll(name, "-", "")
	if len(n) > 31 {
		n = n[:31]
	}
	return n
}

// diskDetachBound is how long Unplug waits for QEMU to let go of an unplugged disk's file.
const diskDetachBound = 30 * time.Second

// Plug makes file a SCSI disk of the running machine with serial number name. A disk of
// that name plugged already is nothing to do.
func (m *Machine) Plug(ctx context.Context, name, file string) error {
	if !diskNamePattern.MatchString(name) {
		return fmt.Errorf("machine %s: disk name %q: want a lower-case letter, then up to 35 letters, digits or '-'", m.spec.Name, name)
	}
	return m.monitor(ctx, func(run runFunc) error {
		if plugged, err := hasDevice(run, name); err != nil || plugged {
			return err
		}
		_, err := run("blockdev-add", map[string]any{
			"driver": "raw", "node-name": nodeName(name), "cache": map[string]any{"direct": true},
			"file": map[string]any{"driver": "file", "filename": file, "aio": "threads"},
		})
		// A block node without its device: what a Plug that ended between the two steps left.
		if err != nil && !strings.Contains(err.Error(), "Duplicate nodes with node-name") {
			return fmt.Errorf("adding the disk's file %s: %w", file, err)
		}
		if _, err := run("device_add", map[string]any{
			"driver": "scsi-hd", "id": name, "drive": nodeName(name), "bus": VolumeBus, "serial": name,
		}); err != nil {
			return fmt.Errorf("plugging disk %s: %w", name, err)
		}
		return nil
	})
}

// Unplug removes the SCSI disk name from the running machine and waits until QEMU let go of
// its file. A disk that is not plugged is nothing to do.
func (m *Machine) Unplug(ctx context.Context, name string) error {
	if !diskNamePattern.MatchString(name) {
		return fmt.Errorf("machine %s: disk name %q is not one Plug accepts", m.spec.Name, name)
	}
	return m.monitor(ctx, func(run runFunc) error {
		if plugged, err := hasDevice(run, name); err != nil {
			return err
		} else if plugged {
			if _, err := run("device_del", map[string]any{"id": name}); err != nil && !strings.Contains(err.Error(), "not found") {
				return fmt.Errorf("unplugging disk %s: %w", name, err)
			}
		}
		// The device goes at once; its block node a moment later (QEMU drains it first).
		deadline := time.Now().Add(diskDetachBound)
		for {
			_, err := run("blockdev-del", map[string]any{"node-name": nodeName(name)})
			switch {
			case err == nil, strings.Contains(err.Error(), "Failed to find node"):
				return nil
			case !strings.Contains(err.Error(), "is in use") || time.Now().After(deadline):
				return fmt.Errorf("releasing the file of disk %s: %w", name, err)
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("releasing the file of disk %s: %w", name, ctx.Err())
			case <-time.After(200 * time.Millisecond):
			}
		}
	})
}

// PowerButton presses the machine's power button (ACPI): its OS shuts down and powers off.
func (m *Machine) PowerButton(ctx context.Context) error {
	return m.monitor(ctx, func(run runFunc) error {
		_, err := run("system_powerdown", nil)
		return err
	})
}

// runFunc runs one QMP command and returns its answer; a QEMU error is returned with QEMU's
// description.
type runFunc func(command string, args any) ([]byte, error)

// monitor connects to the machine's monitor, runs do, and disconnects. QEMU's monitor
// serves one client at a time, so the machine's callers take turns; ctx bounds the whole
// exchange (the monitor is closed when it ends, which ends a command waiting for QEMU).
func (m *Machine) monitor(ctx context.Context, do func(run runFunc) error) error {
	m.qmpMu.Lock()
	defer m.qmpMu.Unlock()
	mon, err := qmp.NewSocketMonitor("unix", m.QMPSocket(), 5*time.Second)
	if err != nil {
		return fmt.Errorf("machine %s: QEMU's monitor: %w", m.spec.Name, err)
	}
	if err := mon.Connect(); err != nil {
		return fmt.Errorf("machine %s: QEMU's monitor: %w", m.spec.Name, err)
	}
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
		case <-done:
		}
		_ = mon.Disconnect()
	}()
	run := func(command string, args any) ([]byte, error) {
		raw, err := json.Marshal(qmp.Command{Execute: command, Args: args})
		if err != nil {
			return nil, err
		}
		ans, err := mon.Run(raw)
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("%s: %w", command, ctx.Err())
			}
			return nil, fmt.Errorf("%s: %w", command, err)
		}
		return ans, nil
	}
	if err := do(run); err != nil {
		return fmt.Errorf("machine %s: %w", m.spec.Name, err)
	}
	return nil
}

// hasDevice reports whether the machine has a device of that id (one the monitor added, or
// one of its command line with an id).
func hasDevice(run runFunc, id string) (bool, error) {
	raw, err := run("qom-list", map[string]any{"path": "/machine/peripheral"})
	if err != nil {
		return false, err
	}
	var ans struct {
		Return []struct {
			Name string `json:"name"`
		} `json:"return"`
	}
	if err := json.Unmarshal(raw, &ans); err != nil {
		return false, fmt.Errorf("qom-list: %w", err)
	}
	for _, p := range ans.Return {
		if p.Name == id {
			return true, nil
		}
	}
	return false, nil
}
