package cli

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/openconstellation/constellation/internal/bootstrapper/bootstraptest"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/recovery"
	"github.com/openconstellation/constellation/internal/retry"
)

// scriptedRecovery answers recovery attempts with errs in order (nil: recovered), recording
// when (on the fake clock) each attempt was made; cancel, when set, ends the run after the
// last scripted answer.
type scriptedRecovery struct {
	clock  *testingclock.FakeClock
	errs   []error
	cancel context.CancelFunc

	mu    sync.Mutex
	times []time.Time
}

func (s *scriptedRecovery) recover(context.Context, recovery.Config) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.times = append(s.times, s.clock.Now())
	i := len(s.times) - 1
	if i >= len(s.errs) {
		if s.cancel != nil {
			s.cancel()
			return nil, s.errs[len(s.errs)-1]
		}
		return nil, nil
	}
	return nil, s.errs[i]
}

func (s *scriptedRecovery) gaps() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []time.Duration
	for i := 1; i < len(s.times); i++ {
		out = append(out, s.times[i].Sub(s.times[i-1]))
	}
	return out
}

// runPaced runs the recovery loop against one waiting control plane on a fake clock, stepping
// it a second at a time (polled, with a deadline) until the loop ends.
func runPaced(t *testing.T, script *scriptedRecovery, ctx context.Context) (string, error) {
	t.Helper()
	keys := bootstraptest.NewClusterKeys(t)
	st := recoveryState(keys, [2]string{"control-plane-0", someDisk})
	platform := recoveringPlatform{nodes: []provider.Node{{
		NodeSpec: provider.NodeSpec{Name: "control-plane-0", Role: metadata.ControlPlane}, State: provider.Running, Reported: metadata.PhaseWaitingForRecovery,
	}}}
	out := &lockedBuffer{}
	tm := newPhaseTimer(out)
	prog := newProgress(tm)
	prog.clock = script.clock
	stop := prog.start(ctx)
	defer stop()
	rec := controlPlaneRecovery{platform: platform, master: keys.Master, st: st, disks: map[string]string{"control-plane-0": someDisk},
		recover: script.recover, clock: script.clock}
	type result struct{ err error }
	done := make(chan result, 1)
	go func() {
		_, err := rec.run(ctx, tm, prog)
		done <- result{err}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case r := <-done:
			return out.String(), r.err
		default:
		}
		require.True(t, time.Now().Before(deadline), "the loop did not end: %s", out.String())
		if script.clock.HasWaiters() {
			script.clock.Step(time.Second)
		}
		time.Sleep(time.Millisecond)
	}
}

// recover attempts a node no faster than its recovery server admits a caller (5 s), backs off
// after each refusal of the node's limits, takes the node's own retry-after, and recovers it
// in the end.
func TestRecoverPacesEachNode(t *testing.T) {
	unreachable := fmt.Errorf("recover 10.42.0.10:9999: %w: connection refused", recovery.ErrUnreachable)
	busy := fmt.Errorf("recover 10.42.0.10:9999: %w: rate limited: too many attested handshakes from 10.42.0.1 (limit 0.2/s, burst 4); retry later", recovery.ErrBusy)
	clock := testingclock.NewFakeClock(time.Now())
	script := &scriptedRecovery{clock: clock, errs: []error{unreachable, busy, busy, busy, retry.WithDelay(busy, 45*time.Second)}}
	out, err := runPaced(t, script, context.Background())
	require.NoError(t, err)
	assert.Contains(t, out, "control-plane-0 got its keys over attested TLS")

	gaps := script.gaps()
	require.Len(t, gaps, 5)
	for i, g := range gaps {
		assert.GreaterOrEqual(t, g, recovery.MinAttemptInterval, "gap %d: never faster than the node's refill", i)
	}
	// After the refusals: 5, 10, 20 s (jitter ≤ 20 %, rounded up to the next poll) ...
	for i, base := range []time.Duration{5 * time.Second, 10 * time.Second, 20 * time.Second} {
		assert.GreaterOrEqual(t, gaps[i+1], base, "gap after refusal %d", i+1)
		assert.LessOrEqual(t, gaps[i+1], base+base/5+time.Second, "gap after refusal %d", i+1)
	}
	// ... and the node's own retry-after when it asks for longer.
	assert.GreaterOrEqual(t, gaps[4], 45*time.Second)
	// It said what it waited for, every 5 s, with the first cause.
	assert.Contains(t, out, "waiting    control-plane-0: its keys over attested TLS")
	assert.Contains(t, out, "(first error: "+unreachable.Error()+")")
}

// A recovery that never succeeds fails naming the first cause and the last, not only the last
// retry's error.
func TestRecoverFailureNamesFirstCause(t *testing.T) {
	first := fmt.Errorf("recover 10.42.0.10:9999: %w: the node's disk is still being checked", recovery.ErrNotWaiting)
	busy := fmt.Errorf("recover 10.42.0.10:9999: %w: rate limited; retry later", recovery.ErrBusy)
	clock := testingclock.NewFakeClock(time.Now())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	script := &scriptedRecovery{clock: clock, errs: []error{first, busy, busy}, cancel: cancel}
	_, err := runPaced(t, script, ctx)
	require.Error(t, err)
	assert.ErrorIs(t, err, context.Canceled)
	assert.Contains(t, err.Error(), "control planes not recovered: control-plane-0")
	assert.Contains(t, err.Error(), "last error: "+busy.Error())
	assert.Contains(t, err.Error(), "first error: "+first.Error())
	assert.False(t, errors.Is(err, recovery.ErrWrongDisk))
}
