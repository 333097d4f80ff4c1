package vmnet

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/provider/local/sandbox"
	"github.com/openconstellation/constellation/internal/provider/qemu/vm"
)

func TestMAC(t *testing.T) {
	assert.Equal(t, "52:54:00:2a:00:0a", MAC(0))
	assert.Equal(t, "52:54:00:2a:00:d1", MAC(sandbox.MaxNodes-1))
	assert.Equal(t, "mtap3", Tap(3))
	for i := range sandbox.MaxNodes {
		assert.NotEqual(t, sandbox.UplinkDevice, Tap(i), "node %d's tap device is the uplink's", i)
	}
}

// A machine's network card attaches to its tap device on the cluster's bridge (QEMU runs in
// the bridge namespace), beside the DHCP server with the node's static lease. The firmware
// creates no network boot option (only the disk is in the boot order), so the lease itself is
// asked for by the node image's DHCP client (the one-VM test).
func TestMachineOnBridge(t *testing.T) {
	if testing.Short() {
		t.Skip("starts QEMU, dnsmasq and network namespaces (root)")
	}
	require.Equal(t, 0, os.Getuid(), "needs root for network namespaces")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	n := sandbox.Network{ID: fmt.Sprintf("vt%d", os.Getpid()%10000)}
	require.NoError(t, n.CreateBridge(ctx))
	t.Cleanup(func() { _ = n.Delete(context.Background(), nil) })
	const i = 2
	require.NoError(t, AddTap(ctx, n, i))
	d, err := StartDHCP(ctx, n, filepath.Join(dir, "dhcp"), []Lease{{Index: i, Name: "worker-0"}})
	require.NoError(t, err)
	t.Cleanup(d.Stop)
	hosts, err := os.ReadFile(filepath.Join(dir, "dhcp", hostsFile))
	require.NoError(t, err)
	assert.Equal(t, "52:54:00:2a:00:0c,10.42.0.12,worker-0\n", string(hosts))
	require.NoError(t, d.Set(Lease{Index: 3, Name: "worker-1"}))
	require.NoError(t, d.Set(Lease{Index: 2}))
	hosts, err = os.ReadFile(filepath.Join(dir, "dhcp", hostsFile))
	require.NoError(t, err)
	assert.Equal(t, "52:54:00:2a:00:0d,10.42.0.13,worker-1\n", string(hosts))
	require.NoError(t, d.Set(Lease{Index: 2, Name: "worker-0"}))

	image := filepath.Join(dir, "disk.raw")
	require.NoError(t, os.WriteFile(image, make([]byte, 1<<20), 0o644))
	spec := vm.Spec{
		Name: "worker-0", Dir: filepath.Join(dir, "m"), Image: image, StateDiskBytes: 64 << 20,
		MemoryMiB: 512, CPUs: 1, Firmware: vm.DebianOVMF, Accel: vm.TCG,
		NIC: &vm.NIC{Tap: Tap(i), MAC: MAC(i)}, NetNS: sandbox.NSPath(n.BridgeNS()),
	}
	require.NoError(t, vm.Prepare(ctx, spec))
	m, err := vm.Start(ctx, spec)
	require.NoError(t, err)
	t.Cleanup(m.Kill)
	require.NoError(t, m.WaitConsole(ctx, "BdsDxe", nil))
	select {
	case <-d.Done():
		t.Fatal("dnsmasq exited")
	default:
	}
	log, err := os.ReadFile(filepath.Join(dir, "dhcp", "dnsmasq.log"))
	require.NoError(t, err)
	assert.Contains(t, string(log), "read "+filepath.Join(dir, "dhcp", hostsFile))
	assert.NotContains(t, string(log), "cannot read")
}
