package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/provider/local/cluster"
	"github.com/openconstellation/constellation/internal/provider/qemu/vm"
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
// pinned header.
func TestQEMUMachine(t *testing.T) {
	bin, _ := buildBinaries(t)
	image := vmImage(t)
	ws := t.TempDir()
	cli := func(args ...string) (string, error) {
		out, err := exec.Command(bin, append([]string{"-C", ws}, args...)...).CombinedOutput()
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

	out, err := cli("config", "generate", "qemu", "--name", "vm", "--image", image)
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

	out, err = cli("apply")
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
	for _, plain := range []string{"kube-apiserver", "BEGIN CERTIFICATE", "etcd"} {
		assert.False(t, bytes.Contains(raw, []byte(plain)), "%q in the clear on the state disk", plain)
	}
}

// stateDiskOf is a machine's state disk file in the workspace.
func stateDiskOf(t *testing.T, ws, node string) string {
	t.Helper()
	return filepath.Join(ws, "mini", "nodes", node, vm.StateDiskFile)
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
