package vmnet

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/provider/local/sandbox"
	"github.com/openconstellation/constellation/internal/provider/qemu/vm"
)

func TestTryBootImage(t *testing.T) {
	image := os.Getenv("TRY_IMAGE")
	if image == "" {
		t.Skip("TRY_IMAGE")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	dir := "/tmp/vmboot"
	n := sandbox.Network{ID: fmt.Sprintf("vt%d", os.Getpid()%10000)}
	require.NoError(t, n.CreateBridge(ctx))
	t.Cleanup(func() { _ = n.Delete(context.Background(), nil) })
	const i = 0
	require.NoError(t, AddTap(ctx, n, i))
	d, err := StartDHCP(ctx, n, filepath.Join(dir, "dhcp"), []Lease{{Index: i, Name: "cp-0"}})
	require.NoError(t, err)
	t.Cleanup(d.Stop)
	os.RemoveAll(filepath.Join(dir, "m"))
	spec := vm.Spec{
		Name: "cp-0", Dir: filepath.Join(dir, "m"), Image: image, StateDiskBytes: 256 << 20,
		MemoryMiB: 3072, CPUs: 2, Firmware: vm.DebianOVMF, Accel: vm.TCG,
		NIC: &vm.NIC{Tap: Tap(i), MAC: MAC(i)}, NetNS: sandbox.NSPath(n.BridgeNS()),
	}
	require.NoError(t, vm.Prepare(ctx, spec))
	start := time.Now()
	m, err := vm.Start(ctx, spec)
	require.NoError(t, err)
	t.Cleanup(m.Kill)
	for _, want := range []string{"EFI stub", "Run /init", "systemd", "constellation", "bootstrapper"} {
		err := m.WaitConsole(ctx, want, nil)
		t.Logf("%6.1fs %q: %v", time.Since(start).Seconds(), want, err)
	}
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		leases, _ := os.ReadFile(filepath.Join(dir, "dhcp", "dhcp-leases"))
		if len(leases) > 0 {
			t.Logf("%6.1fs lease: %s", time.Since(start).Seconds(), leases)
			break
		}
		time.Sleep(time.Second)
	}
	time.Sleep(20 * time.Second)
}
