package qemu

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/openconstellation/constellation/internal/attestation/softfirmware"
	"github.com/openconstellation/constellation/internal/provider/local/cluster"
	"github.com/openconstellation/constellation/internal/provider/local/sandbox"
	"github.com/openconstellation/constellation/internal/provider/qemu/vm"
	"github.com/openconstellation/constellation/internal/provider/qemu/vmnet"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
)

// Shape is the hardware of a cluster's machines.
type Shape struct {
	MemoryMiB      int         `json:"memoryMiB"`
	CPUs           int         `json:"cpus"`
	StateDiskBytes int64       `json:"stateDiskBytes"`
	Firmware       vm.Firmware `json:"firmware"`
	Accel          vm.Accel    `json:"accel"`
}

// shutdownBound is how long a machine's OS gets to shut down after the power button, before
// its power is cut; under TCG systemd's shutdown of a node takes tens of seconds.
const shutdownBound = 90 * time.Second

// Machines returns the cluster provider's machines for shape: each node a QEMU virtual
// machine (internal/provider/qemu/vm) on a tap device of the cluster's bridge, its address
// from the cluster's DHCP server (vmnet), its TPM provisioned with an AK certificate of the
// cluster's AK CA before every boot, as the sandbox's firmware does.
func Machines(shape Shape) cluster.NewMachines {
	return func(env cluster.MachineEnv) (cluster.Machines, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		dhcp, err := vmnet.StartDHCP(ctx, env.Net, filepath.Join(env.Dir, "dhcp"), nil)
		if err != nil {
			return nil, err
		}
		return &machines{env: env, shape: shape, dhcp: dhcp, running: map[string]*vm.Machine{}}, nil
	}
}

type machines struct {
	env   cluster.MachineEnv
	shape Shape
	dhcp  *vmnet.DHCP

	mu      sync.Mutex
	running map[string]*vm.Machine
}

func (m *machines) spec(node cluster.Machine) vm.Spec {
	return vm.Spec{
		Name: node.Name, Dir: node.Dir, Image: filepath.Join(node.Image, DiskFile), StateDiskBytes: m.shape.StateDiskBytes,
		MemoryMiB: m.shape.MemoryMiB, CPUs: m.shape.CPUs, Firmware: m.shape.Firmware, Accel: m.shape.Accel,
		NIC:   &vm.NIC{Tap: vmnet.Tap(node.Index), MAC: vmnet.MAC(node.Index)},
		NetNS: sandbox.NSPath(m.env.Net.BridgeNS()),
	}
}

// Boot attaches the machine to the bridge and gives it its lease, provisions its TPM (the
// AK certificate, in a platform NV index), and starts QEMU in the node's cgroup.
func (m *machines) Boot(ctx context.Context, node cluster.Machine) (cluster.Power, error) {
	spec := m.spec(node)
	if err := vmnet.AddTap(ctx, m.env.Net, node.Index); err != nil {
		return nil, err
	}
	if err := m.dhcp.Set(vmnet.Lease{Index: node.Index, Name: node.Name}); err != nil {
		return nil, err
	}
	if err := vm.Prepare(ctx, spec); err != nil {
		return nil, err
	}
	if err := vm.ProvisionTPM(ctx, spec, func(tpm *vtpm.TPM) error {
		return softfirmware.CertifyAK(tpm, m.env.CA, node.Name, node.Role, time.Now())
	}); err != nil {
		return nil, err
	}
	cg := m.env.Cgroup.Child(node.Name)
	if err := cg.Create(); err != nil {
		return nil, err
	}
	launcher, err := cluster.InCgroup(cg, nil)
	if err != nil {
		return nil, err
	}
	spec.Launcher = launcher
	machine, err := vm.Start(ctx, spec)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	m.running[node.Name] = machine
	m.mu.Unlock()
	return power{machine}, nil
}

func (m *machines) Detach(ctx context.Context, name string, index int) error {
	m.mu.Lock()
	delete(m.running, name)
	m.mu.Unlock()
	return vmnet.DeleteTap(ctx, m.env.Net, index)
}

// Shutdown presses the machine's power button (ACPI, through QEMU's monitor) and waits until
// its OS powered it off, within shutdownBound.
func (m *machines) Shutdown(name string) {
	m.mu.Lock()
	machine := m.running[name]
	m.mu.Unlock()
	if machine == nil {
		return
	}
	start := time.Now()
	pressCtx, cancelPress := context.WithTimeout(context.Background(), 10*time.Second)
	err := machine.PowerButton(pressCtx)
	cancelPress()
	if err != nil {
		m.env.Log.Warn("graceful shutdown", "node", name, "err", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), shutdownBound)
	defer cancel()
	if err := machine.Wait(ctx); err != nil {
		m.env.Log.Info("graceful shutdown: the machine is still on, cutting its power", "node", name, "after", shutdownBound.String())
		return
	}
	m.env.Log.Info("graceful stop done", "node", name, "took", time.Since(start).Round(time.Millisecond).String())
}

// PlugVolume implements cluster.VolumeDisks: the volume's file becomes a disk of the
// node's running machine, named by the volume's id (its SCSI serial number).
func (m *machines) PlugVolume(ctx context.Context, node, id, file string) error {
	machine, err := m.machine(node)
	if err != nil {
		return err
	}
	return machine.Plug(ctx, id, file)
}

// UnplugVolume implements cluster.VolumeDisks. A machine that is off has nothing plugged.
func (m *machines) UnplugVolume(ctx context.Context, node, id string) error {
	machine, err := m.machine(node)
	if errors.Is(err, errMachineOff) {
		return nil
	}
	if err != nil {
		return err
	}
	return machine.Unplug(ctx, id)
}

// errMachineOff: the node's machine is not running.
var errMachineOff = errors.New("the machine is off")

func (m *machines) machine(node string) (*vm.Machine, error) {
	m.mu.Lock()
	machine := m.running[node]
	m.mu.Unlock()
	if machine == nil {
		return nil, fmt.Errorf("node %s: %w", node, errMachineOff)
	}
	select {
	case <-machine.Exited():
		return nil, fmt.Errorf("node %s: %w", node, errMachineOff)
	default:
		return machine, nil
	}
}

// errNoReachIn: the provider cannot reach into a virtual machine's processes.
var errNoReachIn = errors.New("a virtual machine's API server cannot be stopped from the outside; its node is shut down instead")

func (m *machines) StopAPIServer(string) error { return errNoReachIn }

// Route is nothing to do: a machine's node keeps its own routes (from the metadata's peers).
func (m *machines) Route(context.Context, string, int, bool) error { return nil }

// Describe: a machine has its own cgroup tree; its attachment is a tap in the bridge namespace.
func (m *machines) Describe(string) (string, string) { return "", sandbox.NSPath(m.env.Net.BridgeNS()) }

func (m *machines) Close() { m.dhcp.Stop() }

// power is one boot of a machine.
type power struct{ m *vm.Machine }

// PID is 0: the machine's file system is not the host's to enter (images reach a machine in
// its node image).
func (p power) PID() int                   { return 0 }
func (p power) Exited() <-chan struct{}    { return p.m.Exited() }
func (p power) ExitErr() error             { return p.m.ExitErr() }
func (p power) TPMExited() <-chan struct{} { return p.m.TPM().Exited() }
func (p power) TPMExitErr() error          { return p.m.TPM().ExitErr() }
func (p power) StopTPM() error             { return p.m.TPM().Stop() }
func (p power) KillTPM() error             { return p.m.TPM().Kill() }
