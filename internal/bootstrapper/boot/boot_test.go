package boot_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/attestation/akca"
	"github.com/openconstellation/constellation/internal/bootstrapper/boot"
	"github.com/openconstellation/constellation/internal/bootstrapper/bootstraptest"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/statedisk"
)

// TestRunOnTestPlatform boots the real node program on a second node platform, the
// in-process one of bootstraptest (a measured, certified swtpm, gocryptfs storage, static
// metadata, a stand-in OS): a fresh control plane with no join service yet must get as far
// as offering init. Its TPM quoted (tpmcheck), its check of the join service was built from
// its TPM, its lock and storage were opened; and it committed to nothing: its cluster-ID
// register is still zero and its state storage was not mounted.
func TestRunOnTestPlatform(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a swtpm")
	}
	_, err := exec.LookPath("swtpm")
	require.NoError(t, err, "swtpm is not installed: make deps installs it")
	ca, err := akca.New("local AK CA", time.Now(), time.Hour)
	require.NoError(t, err)
	meta := &metadata.Static{
		Instance: metadata.Instance{Name: "control-plane-1", Role: metadata.ControlPlane, IPs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}},
		Hash:     bootstraptest.InitSecretHash,
	}
	p := bootstraptest.NewPlatform(t, meta, ca, bootstraptest.NodeOptions{Role: metadata.ControlPlane})
	initAddr := freeAddr(t)

	runUntilInitOffered(t, p, initAddr)

	assert.Equal(t, []string{"control-plane-1"}, p.NodeOS.Booted())
	assert.Contains(t, p.Reports(), metadata.PhaseBooting)
	assert.Equal(t, make([]byte, 32), p.ClusterIDRegister(t), "no lock taken before init or join")
	assert.Zero(t, p.NodeOS.StateMounts(), "state mounted before the storage was unlocked")
	assert.Equal(t, bootstraptest.PlatformName, p.Services().Name)
}

// TestRunWaitsOnARefusedStateDisk: a node whose state disk is refused (its header is not the
// one the node makes: replaced while the machine was off) reports so, uses nothing of it, and
// looks again; once the disk is one it will use (the operator restored it) the node goes on,
// without a restart, to offer init.
func TestRunWaitsOnARefusedStateDisk(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a swtpm")
	}
	boot.SetStateDiskRecheck(t, 200*time.Millisecond)
	ca, err := akca.New("local AK CA", time.Now(), time.Hour)
	require.NoError(t, err)
	meta := &metadata.Static{
		Instance: metadata.Instance{Name: "control-plane-1", Role: metadata.ControlPlane, IPs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}},
		Hash:     bootstraptest.InitSecretHash,
	}
	p := &refusingPlatform{Platform: bootstraptest.NewPlatform(t, meta, ca, bootstraptest.NodeOptions{Role: metadata.ControlPlane})}
	p.refusals.Store(3)
	initAddr := freeAddr(t)

	runUntilInitOffered(t, p, initAddr)

	assert.Contains(t, p.Reports(), metadata.PhaseStateDiskRefused)
	assert.Zero(t, p.refusals.Load(), "the node looked at its disk until it was accepted")
	assert.Zero(t, p.NodeOS.StateMounts(), "nothing of the state disk used")
}

// refusingPlatform is a node platform whose state storage is refused the first times the
// node looks at it.
type refusingPlatform struct {
	*bootstraptest.Platform
	refusals atomic.Int32
}

func (p *refusingPlatform) Storage() (statedisk.Storage, error) {
	s, err := p.Platform.Storage()
	return refusingStorage{Storage: s, refusals: &p.refusals}, err
}

type refusingStorage struct {
	statedisk.Storage
	refusals *atomic.Int32
}

func (s refusingStorage) Exists() (bool, error) {
	if s.refusals.Add(-1) >= 0 {
		return true, fmt.Errorf("state storage on /dev/vdb: %w: segment 0 has no integrity protection", statedisk.ErrHeaderRefused)
	}
	s.refusals.Store(0)
	return s.Storage.Exists()
}

// runUntilInitOffered runs the node program on p until it offers init at initAddr; it is
// stopped when t ends.
func runUntilInitOffered(t *testing.T, p boot.Platform, initAddr string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- boot.Run(ctx, p, boot.Options{InitAddr: initAddr, RecoverAddr: freeAddr(t), Log: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("boot.Run did not return when its context ended")
		}
	})

	require.Eventually(t, func() bool {
		select {
		case err := <-done:
			require.NoError(t, err, "boot.Run returned before offering init")
		default:
		}
		c, err := net.Dial("tcp", initAddr)
		if err != nil {
			return false
		}
		_ = c.Close()
		return true
	}, 60*time.Second, 100*time.Millisecond, "the node never offered init")
}

// freeAddr returns a loopback address no one listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// testWriter logs the node program's log lines into the test's.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) { w.t.Log(string(b)); return len(b), nil }
