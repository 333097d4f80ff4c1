package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/measuredboot"
	"github.com/openconstellation/constellation/internal/provider/local/cluster"
	"github.com/openconstellation/constellation/internal/provider/local/sandbox"
	"github.com/openconstellation/constellation/internal/provider/qemu"
	"github.com/openconstellation/constellation/internal/provider/qemu/vm"
	"github.com/openconstellation/constellation/internal/provider/qemu/vmnet"
	"github.com/openconstellation/constellation/internal/state"
	"github.com/openconstellation/constellation/internal/statedisk"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// vmImage is the node OS image the QEMU tests boot ($CONSTELLATION_VM_IMAGE or
// _output/vm-image, make vm-image: the e2e tier builds it first).
func vmImage(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("CONSTELLATION_VM_IMAGE")
	if dir == "" {
		dir = filepath.Join(repoOutput(t), "vm-image")
	}
	for _, f := range []string{"disk.raw", "uki.efi", "manifest.json"} {
		_, err := os.Stat(filepath.Join(dir, f))
		require.NoError(t, err, "the node OS image: run make vm-image")
	}
	return dir
}

// TestQEMUMachine is the one-VM test of the QEMU provider: a control plane that is a QEMU
// machine under OVMF (TCG on these hosts) boots the node OS image, attests with the
// registers its firmware measured against reference values predicted from the image's bytes
// (config generate qemu), receives the cluster's secret over attested TLS, formats and opens
// its state disk as LUKS2 with dm-integrity under the key derived from it, runs kubeadm init,
// and answers verify. The state disk seen from the host is a LUKS2 container with the
// pinned header. Then the host modifies sectors of that disk while the machine is off, and
// the machine refuses them at recover.
func TestQEMUMachine(t *testing.T) {
	bin, _ := buildBinaries(t)
	image := vmImage(t)
	ws := t.TempDir()
	cli := func(args ...string) (string, error) {
		start := time.Now()
		out, err := exec.Command(bin, append([]string{"-C", ws}, args...)...).CombinedOutput()
		t.Logf("constellation %s: %s", strings.Join(args, " "), time.Since(start).Round(time.Second))
		return string(out), err
	}
	var id string
	t.Cleanup(func() {
		out, err := cli("terminate", "--yes")
		assert.NoError(t, err, out)
		if id != "" {
			assertNoLeftovers(t, ws, id)
		}
	})

	out, err := cli(append([]string{"config", "generate", "qemu", "--name", "vm", "--image", image}, firmwareRecordArgs(t, image)...)...)
	require.NoError(t, err, out)
	conf, err := config.Load(filepath.Join(ws, config.FileName))
	require.NoError(t, err)
	vals := conf.Attestation[variant.QEMUVTPM.ConfigKey()]
	require.NotNil(t, vals)
	require.Len(t, vals.Measurements, 1)
	m := vals.Measurements[0].Measurements
	for _, r := range []uint32{0, 4, 5, 9, 10, 11} {
		require.Contains(t, m, r, "PCR %d is a reference value", r)
		assert.False(t, m[r].WarnOnly, "PCR %d is enforced", r)
	}

	out, err = cli("create")
	require.NoError(t, err, out)
	status, err := cluster.ReadStatus(filepath.Join(ws, "mini"))
	require.NoError(t, err)
	id = status.NetworkID
	t.Cleanup(func() { dumpConsoles(t, ws) })

	// A bound for a stuck run, not a speed check (docs/benchmarks.md has the times): under TCG
	// on a busy host the boot's image import alone took 4.5 minutes, and init may use its whole
	// budget of 15 minutes from the node lock (initserver.DefaultInitTimeout).
	out, err = cli("apply", "--timeout", "30m")
	require.NoError(t, err, out)
	assert.Contains(t, out, "over attested TLS")
	st, err := state.Load(filepath.Join(ws, state.FileName))
	require.NoError(t, err)
	assert.Equal(t, state.Initialized, st.Phase)

	out, err = cli("verify")
	require.NoError(t, err, out)
	assert.Contains(t, out, "OK    control-plane-0")
	assert.Contains(t, out, "1 of 1 nodes verified: cluster vm")

	// The state disk, as the host sees it: LUKS2 with the header the node pins
	// (authenticated encryption, 4096-byte sectors), nothing of Kubernetes in the clear.
	disk := stateDiskOf(t, ws, "control-plane-0")
	f, err := os.Open(disk)
	require.NoError(t, err)
	defer f.Close()
	hdr, err := statedisk.ParseLUKS2Header(f)
	require.NoError(t, err, "the header the node formatted is the pinned one")
	assert.True(t, hdr.Initialized, "the node marked its state disk initialized")
	raw, err := os.ReadFile(disk)
	require.NoError(t, err)
	// Strings of 10 bytes or more: a shorter one turns up by chance in 2 GiB of ciphertext.
	for _, plain := range []string{"kube-apiserver", "BEGIN CERTIFICATE", "/registry/"} {
		assert.False(t, bytes.Contains(raw, []byte(plain)), "%q in the clear on the state disk", plain)
	}
	raw = nil

	// A pod's encrypted volume on a machine is the cluster tier's (TestQEMUCluster, make
	// vm-e2e): it took 3 to 9 minutes of this test under TCG, which CI's time cannot spare.
	assertModifiedSectorsRefused(t, cli, ws, disk, hdr)
}

// assertModifiedSectorsRefused: the host changes sectors of the encrypted data while the
// machine is off. dm-crypt checks each sector's tag as it reads it: the node's mount reads
// nothing, recover fails naming why, and the node formats nothing.
func assertModifiedSectorsRefused(t *testing.T, cli func(args ...string) (string, error), ws, disk string, hdr *statedisk.LUKS2Header) {
	t.Helper()
	out, err := cli("stop", "--timeout", "10m")
	require.NoError(t, err, out)
	// stop is a shutdown, not a power cut: the machine's OS powered itself off.
	console, err := os.ReadFile(filepath.Join(ws, "mini", "nodes", "control-plane-0", vm.ConsoleFile))
	require.NoError(t, err)
	assert.Contains(t, string(console), "reboot: Power down", "the machine shut down by itself")
	// The image's node program took its platform from the firmware (--platform auto).
	assert.Regexp(t, `"msg":"node platform detected","platform":"qemu","dmi":"sys_vendor \\"QEMU\\"`, string(console))
	modifySectorsOffline(t, disk, hdr.DataOffset)
	out, err = cli("start", "--timeout", "15m")
	require.NoError(t, err, out)
	out, err = cli("recover", "--timeout", "20m")
	require.Error(t, err, "recover of a machine whose state disk was modified offline:\n%s", out)
	assert.Contains(t, out, statedisk.ErrSectorRefused.Error())
	assert.Contains(t, out, "input/output error")
	assert.Equal(t, hdr.UUID, luksUUID(t, disk), "the node kept its state disk")
}

// modifySectorsOffline is a host's attack on a stopped machine's state disk: one byte
// changed in every 4 KiB block of the first 64 MiB of the encrypted data segment at
// dataOffset. That range holds the dm-integrity journal (a sixteenth of it on a 2 GiB disk:
// the kernel's default is 1/128 of the device), the first area's tags and the filesystem's
// first blocks, its superblock among them. The dm-integrity superblock, the segment's first
// block, is kept: the volume still opens, and what is refused is the data.
func modifySectorsOffline(t *testing.T, disk string, dataOffset uint64) {
	t.Helper()
	f, err := os.OpenFile(disk, os.O_RDWR, 0)
	require.NoError(t, err)
	defer f.Close()
	b := make([]byte, 1)
	for off := int64(dataOffset) + 4096; off < int64(dataOffset)+64<<20; off += 4096 {
		_, err := f.ReadAt(b, off+100)
		require.NoError(t, err)
		b[0] ^= 0x5a
		_, err = f.WriteAt(b, off+100)
		require.NoError(t, err)
	}
	require.NoError(t, f.Sync())
}

// firmwareRecordArgs are the config generate qemu flags for this host's firmware: none when
// the repository records it; otherwise (a Debian update of ovmf since) the test records it
// first, by one boot of the image (go run ./hack/qemu-firmware), and passes the record, as
// docs/measured-boot.md tells a user to.
func firmwareRecordArgs(t *testing.T, image string) []string {
	t.Helper()
	_, err := qemu.Platform{}.ReferenceValues(image)
	if !errors.Is(err, measuredboot.ErrNoFirmwareRecord) {
		return nil // recorded, or a failure config generate names
	}
	t.Logf("%v: recording one", err)
	dir := t.TempDir()
	record := filepath.Join(dir, "firmware.json")
	_, file, _, _ := runtime.Caller(0)
	cmd := exec.Command("go", "run", "./hack/qemu-firmware", "-image", image, "-work", filepath.Join(dir, "work"), "-out", record)
	cmd.Dir = filepath.Join(filepath.Dir(file), "..", "..")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "recording the firmware registers:\n%s", out)
	return []string{"--firmware-record", record}
}

// stateDiskOf is a machine's state disk file in the workspace.
func stateDiskOf(t *testing.T, ws, node string) string {
	t.Helper()
	return filepath.Join(ws, "mini", "nodes", node, vm.StateDiskFile)
}

// luksUUID is the UUID of the LUKS2 volume on a machine's state disk.
func luksUUID(t *testing.T, disk string) string {
	t.Helper()
	f, err := os.Open(disk)
	require.NoError(t, err)
	defer f.Close()
	h, err := statedisk.ParseLUKS2Header(f)
	require.NoError(t, err)
	return h.UUID
}

// dumpConsoles logs the tail of every machine's serial console when the test failed.
func dumpConsoles(t *testing.T, ws string) {
	if !t.Failed() {
		return
	}
	consoles, _ := filepath.Glob(filepath.Join(ws, "mini", "nodes", "*", vm.ConsoleFile))
	for _, c := range consoles {
		data, err := os.ReadFile(c)
		if err != nil {
			continue
		}
		lines := strings.Split(string(data), "\n")
		if len(lines) > 80 {
			lines = lines[len(lines)-80:]
		}
		t.Logf("%s (last lines):\n%s", c, strings.Join(lines, "\n"))
	}
}

// TestQEMUTamperedRoot boots a copy of the node OS image in which one byte of the node
// program (the bootstrapper, compressed in the erofs root) is changed on the disk, as a host
// that owns the disk could: dm-verity, whose root hash is on the measured command line,
// refuses the block, the program cannot start, and the node never serves attestation.
func TestQEMUTamperedRoot(t *testing.T) {
	buildBinaries(t)
	image := vmImage(t)
	dir := t.TempDir()
	disk := filepath.Join(dir, "disk.raw")
	offset := bootstrapperByte(t, image, dir)
	copyFile(t, filepath.Join(image, "disk.raw"), disk)
	f, err := os.OpenFile(disk, os.O_RDWR, 0)
	require.NoError(t, err)
	b := make([]byte, 1)
	_, err = f.ReadAt(b, offset)
	require.NoError(t, err)
	b[0] ^= 0x01
	_, err = f.WriteAt(b, offset)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	n := sandbox.Network{ID: fmt.Sprintf("vr%d", os.Getpid()%10000)}
	require.NoError(t, n.CreateBridge(ctx))
	t.Cleanup(func() { _ = n.Delete(context.Background(), nil) })
	const i = 0
	require.NoError(t, vmnet.AddTap(ctx, n, i))
	d, err := vmnet.StartDHCP(ctx, n, filepath.Join(dir, "dhcp"), []vmnet.Lease{{Index: i, Name: "control-plane-0"}})
	require.NoError(t, err)
	t.Cleanup(d.Stop)
	spec := vm.Spec{
		Name: "control-plane-0", Dir: filepath.Join(dir, "m"), Image: disk, StateDiskBytes: 64 << 20,
		MemoryMiB: qemu.DefaultShape.MemoryMiB, CPUs: qemu.DefaultShape.CPUs, Firmware: vm.DebianOVMF, Accel: vm.TCG,
		NIC: &vm.NIC{Tap: vmnet.Tap(i), MAC: vmnet.MAC(i)}, NetNS: sandbox.NSPath(n.BridgeNS()),
	}
	require.NoError(t, vm.Prepare(ctx, spec))
	m, err := vm.Start(ctx, spec)
	require.NoError(t, err)
	t.Cleanup(m.Kill)
	progress := func(last string) { t.Logf("tampered machine: %s", last) }
	require.NoError(t, m.WaitConsole(ctx, "is corrupted", progress), "dm-verity refuses the changed block")
	require.NoError(t, m.WaitConsole(ctx, "constellation-bootstrapper.service: Failed", progress), "the node program cannot start")
	console, err := m.Console()
	require.NoError(t, err)
	assert.Regexp(t, `device-mapper: verity: [0-9:]+: data block [0-9]+ is corrupted`, string(console))
	assert.NotContains(t, string(console), "serving init", "the node never serves attestation")
}

// bootstrapperByte returns the offset, in the image's disk, of a byte inside the first
// compressed block of the bootstrapper binary: the root partition's start (GPT) plus the
// block's physical offset in the erofs root (dump.erofs).
func bootstrapperByte(t *testing.T, image, dir string) int64 {
	t.Helper()
	out, err := exec.Command("sfdisk", "--json", filepath.Join(image, "disk.raw")).Output()
	require.NoError(t, err)
	var table struct {
		PartitionTable struct {
			SectorSize int `json:"sectorsize"`
			Partitions []struct {
				Start int64  `json:"start"`
				Size  int64  `json:"size"`
				Name  string `json:"name"`
			} `json:"partitions"`
		} `json:"partitiontable"`
	}
	require.NoError(t, json.Unmarshal(out, &table))
	var start, size int64
	for _, p := range table.PartitionTable.Partitions {
		if p.Name == "root" {
			start, size = p.Start*int64(table.PartitionTable.SectorSize), p.Size*int64(table.PartitionTable.SectorSize)
		}
	}
	require.NotZero(t, start, "no root partition in %s", out)
	src, err := os.Open(filepath.Join(image, "disk.raw"))
	require.NoError(t, err)
	defer src.Close()
	root := filepath.Join(dir, "root.erofs")
	dst, err := os.Create(root)
	require.NoError(t, err)
	_, err = io.Copy(dst, io.NewSectionReader(src, start, size))
	require.NoError(t, err)
	require.NoError(t, dst.Close())
	t.Cleanup(func() { os.Remove(root) })
	out, err = exec.Command("dump.erofs", "--path=/usr/lib/constellation/image/bootstrapper", "-e", root).CombinedOutput()
	require.NoError(t, err, "%s", out)
	// "   0:        0..    9236 |    9236 :   95481856..  95485952 |    4096"
	match := regexp.MustCompile(`(?m)^\s*0:\s+\d+\.\.\s*\d+\s*\|\s*\d+\s*:\s*(\d+)\.\.`).FindSubmatch(out)
	require.NotNil(t, match, "no first extent in %s", out)
	phys, err := strconv.ParseInt(string(match[1]), 10, 64)
	require.NoError(t, err)
	return start + phys + 100
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	src, err := os.Open(from)
	require.NoError(t, err)
	defer src.Close()
	dst, err := os.Create(to)
	require.NoError(t, err)
	_, err = io.Copy(dst, src)
	require.NoError(t, err)
	require.NoError(t, dst.Close())
}
