package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/provider/local/sandbox"
	"github.com/openconstellation/constellation/internal/testtier"
)

// TestUplinkRestarted: when slirp4netns dies while the cluster runs (the host's cable pulled),
// the provider starts a new uplink, and stops trying once the cluster ends.
func TestUplinkRestarted(t *testing.T) {
	testtier.Integration(t, "network namespaces and slirp4netns, as root")
	idBytes := make([]byte, 3)
	_, _ = rand.Read(idBytes)
	p := &Provider{net: sandbox.Network{ID: hex.EncodeToString(idBytes)}, log: slog.New(slog.DiscardHandler), spec: Spec{NAT: &NATSpec{}}}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	t.Cleanup(func() { _ = p.net.Delete(context.Background(), nil) })
	require.NoError(t, p.net.CreateBridge(ctx))
	first, err := p.net.StartUplink(ctx, false)
	require.NoError(t, err)
	p.uplink = first
	done := make(chan struct{})
	go func() { defer close(done); p.keepUplink(ctx, first) }()
	current := func() *sandbox.Uplink {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.uplink
	}
	t.Cleanup(func() {
		cancel()
		<-done
		if u := current(); u != nil {
			u.Stop()
		}
	})

	require.NoError(t, syscall.Kill(first.PID(), syscall.SIGKILL))
	require.Eventually(t, func() bool { return current() != first }, 30*time.Second, 100*time.Millisecond, "a new uplink replaces the dead one")
	second := current()
	select {
	case <-second.Done():
		t.Fatalf("the new uplink is not running: %v", second.Err())
	default:
	}
	assert.NotEqual(t, first.PID(), second.PID())

	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("keepUplink did not return after the cluster ended")
	}
}
