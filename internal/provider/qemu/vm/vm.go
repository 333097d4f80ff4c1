// Package vm runs one virtual machine of the QEMU provider: a q35 machine with OVMF firmware,
// its own swtpm as TPM 2.0, a copy-on-write boot disk over the node image and a state disk,
// started by QEMU directly (no libvirt, no daemon between us and the machine).
//
// The boot disk is the node image itself, attached read-only: the image's root is verified
// by dm-verity and its ESP holds only the measured UKI, so the machine has nothing to write
// there, and one image file serves every machine without a copy-on-write layer per machine.
//
// The machine is built so that what its firmware measures depends only on the firmware build,
// the machine's shape and the node image, never on the host it runs on or on the node:
//
//   - -nodefaults and explicit devices: no default DVD-ROM, no default NIC, no VGA; the boot
//     disk is the only boot option (bootindex 1), so the firmware's PCR 4 holds exactly the
//     UKI's launch (docs/measured-boot.md);
//   - the network card carries no option ROM (romfile=""): an iPXE ROM would be measured into
//     PCR 2 and would change with QEMU's package;
//   - a virtio-scsi controller for the volumes' disks is always there, and disks are plugged
//     only into a running machine (disks.go), so volumes never change what the firmware sees;
//   - every machine gets a fresh copy of the firmware's variable store template, so boot
//     options and variables start from the firmware build's defaults.
//
// A Spec is data; Prepare creates the machine's files once (idempotent: a state disk that
// exists is kept, it is the machine's state), and Start powers the machine on. Powering off is a kill
// of QEMU and its swtpm (a power cut) or an ACPI shutdown request.
package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/openconstellation/constellation/internal/fileutil"
	"github.com/openconstellation/constellation/internal/measuredboot"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/swtpm"
)

// Firmware is an OVMF build: its code (read-only flash) and the template of its variable
// store (copied per machine).
type Firmware struct {
	Code         string
	VarsTemplate string
}

// DebianOVMF is Debian's OVMF with a 4 MiB flash (package ovmf): the firmware the provider
// boots by default, without Secure Boot keys enrolled.
var DebianOVMF = Firmware{
	Code:         "/usr/share/OVMF/OVMF_CODE_4M.fd",
	VarsTemplate: "/usr/share/OVMF/OVMF_VARS_4M.fd",
}

// Accel is how QEMU runs the guest's instructions.
type Accel string

const (
	// TCG is QEMU's emulator: works everywhere, 3-15x slower than native.
	TCG Accel = "tcg"
	// KVM is hardware virtualization.
	KVM Accel = "kvm"
)

// NIC is the machine's network card, attached to a tap device that exists before Start.
type NIC struct {
	Tap string
	MAC string
}

// Spec is one machine.
type Spec struct {
	// Name is for messages and QEMU's -name.
	Name string
	// Dir is the machine's folder: boot and state disks, variable store, TPM state, console
	// log, QMP socket. Unix socket paths are limited to 107 bytes: keep it short.
	Dir string
	// Image is the node image's disk (raw), the machine's boot disk, attached read-only.
	Image string
	// StateDiskBytes is the state disk's size, made on first Prepare.
	StateDiskBytes int64
	MemoryMiB      int
	CPUs           int
	Firmware       Firmware
	Accel          Accel
	// NIC is the network card; nil gives the machine none.
	NIC *NIC
	// NetNS, when set, is the network namespace (a path, /run/netns/NAME) QEMU runs in: the
	// one that holds the NIC's tap device.
	NetNS string
	// Launcher, when set, is the command QEMU's command line is appended to (it must exec
	// it): the provider's launcher that puts QEMU into the node's cgroup.
	Launcher []string
	// QEMU and Swtpm are the binaries; defaults from PATH.
	QEMU, Swtpm string
}

// Files of a machine in its folder.
const (
	StateDiskFile = "state.raw"
	VarsFile      = "OVMF_VARS.fd"
	TPMDir        = "tpm"
	ConsoleFile   = "console.log"
	QMPSocket     = "qmp.sock"
)

func (s Spec) path(name string) string { return filepath.Join(s.Dir, name) }

func (s Spec) qemu() string { return orDefault(s.QEMU, "qemu-system-x86_64") }

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// Validate checks the spec without touching the host.
func (s Spec) Validate() error {
	var problems []error
	if s.Name == "" {
		problems = append(problems, errors.New("no name"))
	}
	if s.Dir == "" || !filepath.IsAbs(s.Dir) {
		problems = append(problems, fmt.Errorf("machine folder %q is not an absolute path", s.Dir))
	}
	if len(s.path(QMPSocket)) > 107 || len(filepath.Join(s.Dir, TPMDir, "tpm.ctrl")) > 107 {
		problems = append(problems, fmt.Errorf("machine folder %s is too long for its sockets (107 bytes)", s.Dir))
	}
	if s.Image == "" {
		problems = append(problems, errors.New("no node image"))
	}
	if s.MemoryMiB < 512 {
		problems = append(problems, fmt.Errorf("memory %d MiB is below 512 MiB", s.MemoryMiB))
	}
	if s.CPUs < 1 {
		problems = append(problems, fmt.Errorf("%d CPUs", s.CPUs))
	}
	if s.StateDiskBytes < 64<<20 {
		problems = append(problems, fmt.Errorf("state disk of %d bytes is below 64 MiB", s.StateDiskBytes))
	}
	if s.Accel != TCG && s.Accel != KVM {
		problems = append(problems, fmt.Errorf("accelerator %q is neither tcg nor kvm", s.Accel))
	}
	if s.Firmware.Code == "" || s.Firmware.VarsTemplate == "" {
		problems = append(problems, errors.New("no firmware"))
	}
	for _, p := range []string{s.Dir, s.Image, s.Firmware.Code} {
		// QEMU's option syntax splits on commas.
		if strings.Contains(p, ",") {
			problems = append(problems, fmt.Errorf("path %q contains a comma, which QEMU's option syntax cannot express", p))
		}
	}
	if s.NIC != nil && (s.NIC.Tap == "" || s.NIC.MAC == "") {
		problems = append(problems, errors.New("network card without tap device or MAC address"))
	}
	if len(problems) > 0 {
		return fmt.Errorf("machine %q: %w", s.Name, errors.Join(problems...))
	}
	return nil
}

// Args are QEMU's arguments for the machine, given swtpm's control socket.
func (s Spec) Args(tpmCtrl string) []string {
	accel := "tcg,thread=multi"
	cpu := "max"
	if s.Accel == KVM {
		accel, cpu = "kvm", "host"
	}
	args := []string{
		"-name", s.Name,
		"-nodefaults", "-no-user-config", "-nographic",
		"-machine", "q35,smm=on",
		"-accel", accel, "-cpu", cpu,
		"-smp", strconv.Itoa(s.CPUs), "-m", strconv.Itoa(s.MemoryMiB),
		"-drive", "if=pflash,format=raw,unit=0,readonly=on,file=" + s.Firmware.Code,
		"-drive", "if=pflash,format=raw,unit=1,file=" + s.path(VarsFile),
		"-chardev", "socket,id=chrtpm,path=" + tpmCtrl,
		"-tpmdev", "emulator,id=tpm0,chardev=chrtpm",
		"-device", "tpm-crb,tpmdev=tpm0",
		"-drive", "if=none,id=boot,format=raw,readonly=on,file=" + s.Image,
		"-device", "virtio-blk-pci,drive=boot,bootindex=1",
		"-drive", "if=none,id=state,format=raw,cache=none,aio=threads,file=" + s.path(StateDiskFile),
		"-device", "virtio-blk-pci,drive=state,serial=state",
		// The controller of the volumes' disks (Plug), present whether or not any is plugged.
		"-device", "virtio-scsi-pci,id=volumes",
		"-serial", "file:" + s.path(ConsoleFile),
		"-qmp", "unix:" + s.path(QMPSocket) + ",server=on,wait=off",
		"-device", "virtio-rng-pci",
		// A reboot the guest asks for (or a panic) powers the machine off: the provider sees
		// it and decides, as a watchdog, and every boot starts with a fresh TPM power cycle.
		"-no-reboot",
	}
	if s.NIC != nil {
		args = append(args,
			"-netdev", "tap,id=net0,ifname="+s.NIC.Tap+",script=no,downscript=no",
			"-device", "virtio-net-pci,netdev=net0,romfile=,mac="+s.NIC.MAC)
	}
	return args
}

// MeasuredShape is the machine as its firmware measures it besides the firmware itself
// (measuredboot.VMShape): machine type, CPU, memory and the devices in command-line order,
// each with the properties that change what the firmware sees (boot order, option ROM).
func (s Spec) MeasuredShape() measuredboot.VMShape {
	shape := measuredboot.VMShape{CPUs: s.CPUs, MemoryMiB: s.MemoryMiB}
	args := s.Args("")
	for i := 0; i+1 < len(args); i++ {
		switch args[i] {
		case "-machine":
			shape.Machine = args[i+1]
		case "-cpu":
			shape.CPU = args[i+1]
		case "-device":
			props := strings.Split(args[i+1], ",")
			dev := props[0]
			for _, p := range props[1:] {
				if strings.HasPrefix(p, "bootindex=") || strings.HasPrefix(p, "romfile=") {
					dev += " " + p
				}
			}
			shape.Devices = append(shape.Devices, dev)
		}
	}
	return shape
}

// Prepare creates the machine's folder and the files that do not exist yet: the state disk
// (sparse) and the variable store (a copy of the firmware's template). Existing files are the
// machine's state and are kept.
func Prepare(ctx context.Context, s Spec) error {
	if err := s.Validate(); err != nil {
		return err
	}
	if _, err := os.Stat(s.Image); err != nil {
		return fmt.Errorf("machine %s: its node image: %w", s.Name, err)
	}
	if err := os.MkdirAll(filepath.Join(s.Dir, TPMDir), 0o700); err != nil {
		return fmt.Errorf("machine %s: %w", s.Name, err)
	}
	if !exists(s.path(StateDiskFile)) {
		if err := createSparse(s.path(StateDiskFile), s.StateDiskBytes); err != nil {
			return fmt.Errorf("machine %s: creating its state disk: %w", s.Name, err)
		}
	}
	if !exists(s.path(VarsFile)) {
		vars, err := os.ReadFile(s.Firmware.VarsTemplate)
		if err == nil {
			err = fileutil.CreateAtomic(s.path(VarsFile), vars, 0o600)
		}
		if err != nil {
			return fmt.Errorf("machine %s: copying the firmware's variable store: %w", s.Name, err)
		}
	}
	return nil
}

// Machine is a running machine: QEMU and its swtpm.
type Machine struct {
	spec   Spec
	tpm    *swtpm.Process
	cmd    *exec.Cmd
	exited chan struct{}
	err    error

	// qmpMu: QEMU's monitor serves one client at a time.
	qmpMu sync.Mutex
}

// Start powers the machine on: its swtpm (a power cycle: PCRs reset, NV kept), then QEMU.
// The machine runs until it powers itself off, Kill or Shutdown. Prepare must have run.
func Start(ctx context.Context, s Spec) (*Machine, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	for _, f := range []string{StateDiskFile, VarsFile} {
		if !exists(s.path(f)) {
			return nil, fmt.Errorf("machine %s: %s is missing (not prepared)", s.Name, f)
		}
	}
	tpm, err := swtpm.Start(ctx, swtpm.Options{StateDir: filepath.Join(s.Dir, TPMDir), Binary: s.Swtpm, Machine: true})
	if err != nil {
		return nil, fmt.Errorf("machine %s: %w", s.Name, err)
	}
	_ = os.Remove(s.path(QMPSocket))
	log, err := os.OpenFile(s.path("qemu.log"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		_ = tpm.Kill()
		return nil, err
	}
	defer log.Close()
	command := append([]string{s.qemu()}, s.Args(tpm.CtrlPath())...)
	if s.NetNS != "" {
		// nsenter execs QEMU in place: the process (and its parent-death signal) is QEMU's.
		command = append([]string{"nsenter", "--net=" + s.NetNS, "--"}, command...)
	}
	command = append(append([]string(nil), s.Launcher...), command...)
	cmd := exec.Command(command[0], command[1:]...)
	cmd.Stdout, cmd.Stderr = log, log
	// A machine dies with the process that runs it, as swtpm does.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = tpm.Kill()
		return nil, fmt.Errorf("machine %s: starting %s: %w", s.Name, s.qemu(), err)
	}
	m := &Machine{spec: s, tpm: tpm, cmd: cmd, exited: make(chan struct{})}
	go func() {
		m.err = cmd.Wait()
		close(m.exited)
	}()
	return m, nil
}

// TPM is the machine's swtpm: it runs until StopTPM, KillTPM or Kill, also after QEMU
// exited (the machine's power-off stops it).
func (m *Machine) TPM() *swtpm.Process { return m.tpm }

// QMPSocket is the path of QEMU's monitor socket (QMP).
func (m *Machine) QMPSocket() string { return m.spec.path(QMPSocket) }

// Exited is closed once QEMU exited.
func (m *Machine) Exited() <-chan struct{} { return m.exited }

// ExitErr says how QEMU ended, with the last lines of its own log; valid after Exited.
func (m *Machine) ExitErr() error {
	if m.err == nil {
		return nil
	}
	out, _ := os.ReadFile(m.spec.path("qemu.log"))
	return fmt.Errorf("qemu: %w: %s", m.err, strings.TrimSpace(lastLines(string(out), 5)))
}

// Kill cuts the machine's power: QEMU and its swtpm get SIGKILL. It waits until both exited.
func (m *Machine) Kill() {
	select {
	case <-m.exited:
		return
	default:
	}
	_ = m.cmd.Process.Kill()
	_ = m.tpm.Kill()
	<-m.exited
}

// Wait waits until the machine powered off or ctx ended.
func (m *Machine) Wait(ctx context.Context) error {
	select {
	case <-m.exited:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Console returns the machine's serial console output so far.
func (m *Machine) Console() ([]byte, error) { return os.ReadFile(m.spec.path(ConsoleFile)) }

// WaitConsole polls the console until it contains want, the machine exits, or ctx ends;
// every 5 s it calls progress with the console's last line.
func (m *Machine) WaitConsole(ctx context.Context, want string, progress func(last string)) error {
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	lastReport := time.Now()
	for {
		out, _ := m.Console()
		if strings.Contains(string(out), want) {
			return nil
		}
		if progress != nil && time.Since(lastReport) >= 5*time.Second {
			progress(strings.TrimSpace(lastLines(string(out), 1)))
			lastReport = time.Now()
		}
		select {
		case <-m.exited:
			return fmt.Errorf("machine %s powered off before its console showed %q (%v); console ends: %s", m.spec.Name, want, m.ExitErr(), lastLines(string(out), 10))
		case <-ctx.Done():
			return fmt.Errorf("machine %s: waiting for %q on its console: %w; console ends: %s", m.spec.Name, want, ctx.Err(), lastLines(string(out), 10))
		case <-tick.C:
		}
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func createSparse(path string, size int64) error {
	f, err := os.OpenFile(path+".tmp", os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}

// ProvisionTPM runs provision against the machine's TPM while the machine is off, as a
// platform vendor provisions a TPM before the machine ships: the provider certifies the
// machine's attestation key into a platform NV index there (internal/provider/local's
// CertifyAK). The TPM is powered on for it and off again; the machine's next Start is a
// fresh power cycle, with the firmware's TPM2_Startup. The NV index outlives both.
func ProvisionTPM(ctx context.Context, s Spec, provision func(*vtpm.TPM) error) error {
	tpm, err := swtpm.Start(ctx, swtpm.Options{StateDir: filepath.Join(s.Dir, TPMDir), Binary: s.Swtpm})
	if err != nil {
		return fmt.Errorf("machine %s: provisioning its TPM: %w", s.Name, err)
	}
	defer tpm.Stop()
	t, err := tpm.Open(ctx)
	if err != nil {
		return fmt.Errorf("machine %s: provisioning its TPM: %w", s.Name, err)
	}
	defer t.Close()
	if err := provision(t); err != nil {
		return fmt.Errorf("machine %s: provisioning its TPM: %w", s.Name, err)
	}
	return nil
}
