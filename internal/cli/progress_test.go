package cli

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	testingclock "k8s.io/utils/clock/testing"
)

// lockedBuffer is a bytes.Buffer for output written from several goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// waitForLines polls (with a deadline) until out has n lines.
func waitForLines(t *testing.T, out *lockedBuffer, n int) []string {
	t.Helper()
	var lines []string
	require.Eventually(t, func() bool {
		lines = strings.Split(strings.TrimSpace(out.String()), "\n")
		if out.String() == "" {
			lines = nil
		}
		return len(lines) >= n
	}, 5*time.Second, time.Millisecond, "%d lines: %q", n, out.String())
	return lines
}

// A waiting command reports every 5 s, per node, what it waits for, its last error and its
// first when it differs; nothing between two reports, nothing for a node that is done.
func TestProgressCadence(t *testing.T) {
	clock := testingclock.NewFakeClock(time.Now())
	out := &lockedBuffer{}
	p := newProgress(newPhaseTimer(out))
	p.clock = clock
	p.waiting("control-plane-0", "its keys over attested TLS")
	p.waiting("worker-0", "to register with Kubernetes")
	stop := p.start(context.Background())
	defer stop()
	require.Eventually(t, clock.HasWaiters, 5*time.Second, time.Millisecond)

	clock.Step(4999 * time.Millisecond)
	assert.Empty(t, out.String(), "nothing before 5 s")
	clock.Step(time.Millisecond)
	lines := waitForLines(t, out, 2)
	assert.Contains(t, lines[0], "waiting    control-plane-0: its keys over attested TLS")
	assert.Contains(t, lines[1], "waiting    worker-0: to register with Kubernetes")

	p.failed("control-plane-0", errors.New("connection refused"))
	p.failed("control-plane-0", errors.New("rate limited: too many attested handshakes; retry later"))
	p.failed("control-plane-0", errors.New("rate limited: too many attested handshakes; retry later"))
	p.done("worker-0")
	clock.Step(5 * time.Second)
	lines = waitForLines(t, out, 3)
	require.Len(t, lines, 3)
	assert.Contains(t, lines[2], "control-plane-0: its keys over attested TLS; last error: rate limited: too many attested handshakes; retry later (first error: connection refused) [3 errors]")
	assert.Contains(t, p.summary(), "control-plane-0 (waiting for its keys over attested TLS; last error: rate limited")
	assert.NotContains(t, p.summary(), "worker-0")

	// No error since: the last one is shown with its age (the calls succeed again).
	clock.Step(5 * time.Second)
	lines = waitForLines(t, out, 4)
	assert.Contains(t, lines[3], "control-plane-0: its keys over attested TLS; last error (10s ago): rate limited")

	stop()
	clock.Step(time.Minute)
	assert.Len(t, strings.Split(strings.TrimSpace(out.String()), "\n"), 4, "no report after stop")
}

// A new step of a node starts with no errors: the errors of the step before were retried
// away, and shown under the new step they would name the wrong cause.
func TestProgressStepForgetsEarlierErrors(t *testing.T) {
	p := newProgress(newPhaseTimer(&lockedBuffer{}))
	p.step("control-plane-1", "finding an etcd member to run etcdctl on")
	p.failed("control-plane-1", errors.New("no running and ready etcd static pod"))
	assert.Contains(t, p.describe("control-plane-1"), "last error: no running and ready etcd static pod")
	p.step("control-plane-1", "recording the removal in the cluster")
	assert.Equal(t, "recording the removal in the cluster", p.describe("control-plane-1"))
	// waiting keeps the errors: a wait says what it waits for now, and its errors go on.
	p.failed("control-plane-1", errors.New("connection refused"))
	p.waiting("control-plane-1", "its keys over attested TLS (next attempt in 4s)")
	assert.Contains(t, p.describe("control-plane-1"), "last error: connection refused")
}
