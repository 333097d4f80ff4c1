package vm

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func testSpec(dir string) Spec {
	return Spec{
		Name: "cp-0", Dir: dir, Image: "/images/disk.raw", StateDiskBytes: 1 << 30,
		MemoryMiB: 2560, CPUs: 2, Firmware: DebianOVMF, Accel: TCG,
		NIC: &NIC{Tap: "tap0", MAC: "52:54:00:00:00:01"},
	}
}

// The machine's shape decides what its firmware measures: these arguments are pinned.
func TestArgsPinMeasuredShape(t *testing.T) {
	args := strings.Join(testSpec("/m/cp-0").Args("/m/cp-0/tpm/tpm.ctrl"), " ")
	for _, want := range []string{
		"-nodefaults",                           // no default DVD-ROM before the boot disk (PCR 4)
		"-machine q35,smm=on",                   // the firmware's machine type
		"virtio-blk-pci,drive=boot,bootindex=1", // the image is the first boot option
		"format=raw,readonly=on,file=/images/disk.raw",
		"virtio-net-pci,netdev=net0,romfile=,mac=52:54:00:00:00:01", // no option ROM in PCR 2
		"-device tpm-crb,tpmdev=tpm0",
		"-tpmdev emulator,id=tpm0,chardev=chrtpm",
		"if=pflash,format=raw,unit=0,readonly=on,file=/usr/share/OVMF/OVMF_CODE_4M.fd",
		"if=pflash,format=raw,unit=1,file=/m/cp-0/OVMF_VARS.fd",
		"-accel tcg,thread=multi -cpu max",
	} {
		assert.Contains(t, args, want)
	}
	// Only the boot disk is a boot option.
	assert.Equal(t, 1, strings.Count(args, "bootindex="))

	kvm := testSpec("/m/cp-0")
	kvm.Accel, kvm.NIC = KVM, nil
	args = strings.Join(kvm.Args("/c"), " ")
	assert.Contains(t, args, "-accel kvm -cpu host")
	assert.NotContains(t, args, "netdev")
}

func TestValidate(t *testing.T) {
	for name, tc := range map[string]struct {
		change func(*Spec)
		want   string
	}{
		"ok":            {func(*Spec) {}, ""},
		"relative dir":  {func(s *Spec) { s.Dir = "m" }, "not an absolute path"},
		"long dir":      {func(s *Spec) { s.Dir = "/" + strings.Repeat("d", 100) }, "too long for its sockets"},
		"comma":         {func(s *Spec) { s.Image = "/a,b/disk.raw" }, "contains a comma"},
		"little memory": {func(s *Spec) { s.MemoryMiB = 256 }, "below 512 MiB"},
		"small disk":    {func(s *Spec) { s.StateDiskBytes = 1 << 20 }, "below 64 MiB"},
		"accel":         {func(s *Spec) { s.Accel = "hvf" }, "neither tcg nor kvm"},
		"nic":           {func(s *Spec) { s.NIC = &NIC{Tap: "tap0"} }, "without tap device or MAC"},
	} {
		t.Run(name, func(t *testing.T) {
			s := testSpec("/m/cp-0")
			tc.change(&s)
			err := s.Validate()
			if tc.want == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// Prepare makes what is missing and keeps what exists: the state disk is the machine's data.
func TestPrepareKeepsState(t *testing.T) {
	dir := t.TempDir()
	image := filepath.Join(dir, "disk.raw")
	require.NoError(t, os.WriteFile(image, []byte("image"), 0o644))
	vars := filepath.Join(dir, "vars.fd")
	require.NoError(t, os.WriteFile(vars, []byte("vars"), 0o644))
	s := testSpec(filepath.Join(dir, "m"))
	s.Image, s.Firmware = image, Firmware{Code: "/code.fd", VarsTemplate: vars}

	require.NoError(t, Prepare(context.Background(), s))
	fi, err := os.Stat(filepath.Join(s.Dir, StateDiskFile))
	require.NoError(t, err)
	assert.Equal(t, s.StateDiskBytes, fi.Size())
	data, err := os.ReadFile(filepath.Join(s.Dir, VarsFile))
	require.NoError(t, err)
	assert.Equal(t, "vars", string(data))

	f, err := os.OpenFile(filepath.Join(s.Dir, StateDiskFile), os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte("data"), 0)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	require.NoError(t, Prepare(context.Background(), s))
	got := make([]byte, 4)
	f, err = os.Open(filepath.Join(s.Dir, StateDiskFile))
	require.NoError(t, err)
	_, err = f.ReadAt(got, 0)
	require.NoError(t, err)
	f.Close()
	assert.Equal(t, "data", string(got))

	s.Image = filepath.Join(dir, "missing.raw")
	assert.ErrorContains(t, Prepare(context.Background(), s), "its node image")
}

func TestHardwareVirtFlags(t *testing.T) {
	assert.True(t, hardwareVirt.MatchString("processor\t: 0\nflags\t\t: fpu vme vmx sse\n"))
	assert.True(t, hardwareVirt.MatchString("flags\t\t: fpu svm\n"))
	assert.False(t, hardwareVirt.MatchString("flags\t\t: fpu vme sse hypervisor\n"))
}

// The firmware records are keyed by this shape: it must follow the arguments.
func TestMeasuredShape(t *testing.T) {
	shape := testSpec("/m/cp-0").MeasuredShape()
	assert.Equal(t, "q35,smm=on", shape.Machine)
	assert.Equal(t, "max", shape.CPU)
	assert.Equal(t, 2, shape.CPUs)
	assert.Equal(t, 2560, shape.MemoryMiB)
	assert.Equal(t, []string{"tpm-crb", "virtio-blk-pci bootindex=1", "virtio-blk-pci", "virtio-scsi-pci", "virtio-rng-pci", "virtio-net-pci romfile="}, shape.Devices)
}
