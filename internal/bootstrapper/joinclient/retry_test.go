package joinclient_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/openconstellation/constellation/internal/bootstrapper/joinclient"
)

const (
	unreachable = joinclient.Unreachable
	refused     = joinclient.Refused
	// step is the fake clock's resolution in these tests: a measured wait is at most one
	// step longer than the wait Retry asked for.
	step = 5 * time.Millisecond
)

// window is the range a wait must fall in: [min, max].
type window struct{ min, max time.Duration }

func (w window) String() string { return fmt.Sprintf("[%v, %v]", w.min, w.max) }

// pollWait is the wait after an unreachable attempt: PollInterval ± 20 %.
var pollWait = window{
	time.Duration(float64(joinclient.PollInterval) * (1 - joinclient.PollJitter)),
	time.Duration(float64(joinclient.PollInterval) * (1 + joinclient.PollJitter)),
}

// backoffWait is the wait at level n of the refusal back-off: base 0.8 s doubling, capped at
// 24 s, plus up to 25 % jitter (so at most 1 s at first and 30 s at the cap).
func backoffWait(n int) window {
	base := min(800*time.Millisecond<<n, 24*time.Second)
	return window{base, base * 5 / 4}
}

// script runs Retry on a fake clock with attempts that fail with kinds in order and then
// succeed. When cancelAt > 0, the test cancels Retry's context while it waits after attempt
// cancelAt. It returns the waits between attempts, the number of attempts and Retry's error.
func script(t *testing.T, kinds []joinclient.Kind, cancelAt int, log *slog.Logger) ([]time.Duration, int, error) {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Unix(0, 0))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	var at []time.Time
	attempts := func() int { mu.Lock(); defer mu.Unlock(); return len(at) }
	errc := make(chan error, 1)
	go func() {
		errc <- joinclient.Retry(ctx, clk, joinclient.NewSchedule(joinclient.PollInterval, joinclient.NewBackoff), log, func(context.Context) error {
			mu.Lock()
			defer mu.Unlock()
			at = append(at, clk.Now())
			if i := len(at) - 1; i < len(kinds) {
				return &joinclient.AttemptError{Kind: kinds[i], Err: fmt.Errorf("failure %d", i+1)}
			}
			return nil
		})
	}()
	deadline := time.After(time.Minute)
	for {
		select {
		case err := <-errc:
			mu.Lock()
			defer mu.Unlock()
			var waits []time.Duration
			for i := 1; i < len(at); i++ {
				waits = append(waits, at[i].Sub(at[i-1]))
			}
			return waits, len(at), err
		case <-deadline:
			t.Fatal("Retry did not end")
		default:
		}
		// The clock moves only while Retry waits on it, never during an attempt.
		if !clk.HasWaiters() {
			time.Sleep(100 * time.Microsecond)
			continue
		}
		if cancelAt > 0 && attempts() == cancelAt {
			cancel()
			time.Sleep(100 * time.Microsecond)
			continue
		}
		clk.Step(step)
	}
}

// The schedule on a fake clock: polling at a short fixed interval while nothing answers,
// exponential back-off once a service refused, and what mixed sequences do.
func TestRetrySchedule(t *testing.T) {
	repeat := func(k joinclient.Kind, n int) []joinclient.Kind { return slices.Repeat([]joinclient.Kind{k}, n) }
	repeatWait := func(w window, n int) []window { return slices.Repeat([]window{w}, n) }
	testCases := map[string]struct {
		kinds     []joinclient.Kind
		cancelAt  int
		wantWaits []window
		wantErr   error
	}{
		"unreachable only: polls, never grows": {
			kinds:     repeat(unreachable, 30),
			wantWaits: repeatWait(pollWait, 30),
		},
		"refused only: exponential up to the cap": {
			kinds: repeat(refused, 9),
			wantWaits: []window{
				backoffWait(0), backoffWait(1), backoffWait(2), backoffWait(3), backoffWait(4),
				backoffWait(5), backoffWait(6), backoffWait(7), backoffWait(8),
			},
		},
		"a refusal after unreachables starts the back-off from its start": {
			kinds:     []joinclient.Kind{unreachable, unreachable, unreachable, unreachable, refused, refused},
			wantWaits: []window{pollWait, pollWait, pollWait, pollWait, backoffWait(0), backoffWait(1)},
		},
		"unreachable after refusals keeps the back-off: no growth, no reset": {
			kinds: []joinclient.Kind{refused, refused, unreachable, unreachable, unreachable, refused, unreachable},
			wantWaits: []window{
				backoffWait(0), backoffWait(1), backoffWait(1), backoffWait(1), backoffWait(1), backoffWait(2), backoffWait(2),
			},
		},
		"cancelled while polling: no further attempt": {
			kinds:     repeat(unreachable, 5),
			cancelAt:  3,
			wantWaits: []window{pollWait, pollWait},
			wantErr:   context.Canceled,
		},
		"cancelled during the back-off: no further attempt": {
			kinds:     []joinclient.Kind{unreachable, refused, refused},
			cancelAt:  2,
			wantWaits: []window{pollWait},
			wantErr:   context.Canceled,
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			waits, attempts, err := script(t, tc.kinds, tc.cancelAt, slog.New(slog.DiscardHandler))
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
				assert.Equal(t, tc.cancelAt, attempts, "attempts")
			} else {
				require.NoError(t, err)
				assert.Equal(t, len(tc.kinds)+1, attempts, "attempts: every failure retried, then success")
			}
			require.Len(t, waits, len(tc.wantWaits))
			for i, w := range waits {
				want := tc.wantWaits[i]
				assert.True(t, w >= want.min && w <= want.max+step, "wait %d after a %s attempt: %v, want within %v", i+1, tc.kinds[i], w, want)
			}
		})
	}
}

// The limits of the schedule, whatever the jitter: the first refusal waits at most 1 s, no
// wait exceeds 30 s, a poll stays within ± 20 % of 0.5 s.
func TestScheduleBounds(t *testing.T) {
	for range 200 {
		s := joinclient.NewSchedule(joinclient.PollInterval, joinclient.NewBackoff)
		for range 5 {
			assert.True(t, pollWait.min <= s.Wait(unreachable) && s.Wait(unreachable) <= pollWait.max)
		}
		first := s.Wait(refused)
		assert.LessOrEqual(t, first, joinclient.FirstDelayMax)
		assert.Greater(t, first, 700*time.Millisecond)
		for range 12 {
			assert.LessOrEqual(t, s.Wait(refused), joinclient.MaxDelay)
			assert.LessOrEqual(t, s.Wait(unreachable), joinclient.MaxDelay)
		}
	}
}

// What the node logs while it waits: a streak of unreachable attempts logs its first attempt
// and a change of reason, and then one summary per 10 attempts (a node waiting a minute at 2
// attempts/s writes a dozen lines, not 120); every refusal is logged with its reason; the
// success with the counts of failed attempts.
func TestRetryLogsSummarizeUnreachable(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	clk := clocktesting.NewFakeClock(time.Unix(0, 0))
	var attempts int
	errc := make(chan error, 1)
	go func() {
		errc <- joinclient.Retry(context.Background(), clk, joinclient.NewSchedule(joinclient.PollInterval, joinclient.NewBackoff), log, func(context.Context) error {
			attempts++
			switch {
			case attempts <= 25:
				return &joinclient.AttemptError{Kind: unreachable, Err: errors.New("metadata lists no join endpoint yet")}
			case attempts <= 30:
				return &joinclient.AttemptError{Kind: unreachable, Err: errors.New("10.0.0.1:9090: connection refused")}
			case attempts == 31:
				return &joinclient.AttemptError{Kind: refused, Err: errors.New("10.0.0.1:9090: rpc error: code = PermissionDenied")}
			case attempts == 32:
				return &joinclient.AttemptError{Kind: unreachable, Err: errors.New("10.0.0.1:9090: connection refused")}
			}
			return nil
		})
	}()
	var err error
	for done := false; !done; {
		select {
		case err = <-errc:
			done = true
		default:
			if clk.HasWaiters() {
				clk.Step(50 * time.Millisecond)
			} else {
				time.Sleep(100 * time.Microsecond)
			}
		}
	}
	require.NoError(t, err)
	var got []string
	for _, raw := range bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n")) {
		var l struct {
			Msg                                  string
			Kind                                 string
			Attempt                              int
			UnreachableInARow                    int
			Reason                               string
			UnreachableAttempts, RefusedAttempts int
		}
		require.NoError(t, json.Unmarshal(raw, &l))
		got = append(got, fmt.Sprintf("%s #%d [%s] (%d in a row; %d unreachable, %d refused): %s",
			l.Msg, l.Attempt, l.Kind, l.UnreachableInARow, l.UnreachableAttempts, l.RefusedAttempts, l.Reason))
	}
	assert.Equal(t, []string{
		"waiting for a join service #1 [unreachable] (0 in a row; 0 unreachable, 0 refused): metadata lists no join endpoint yet",
		"still waiting for a join service #10 [unreachable] (10 in a row; 0 unreachable, 0 refused): metadata lists no join endpoint yet",
		"still waiting for a join service #20 [unreachable] (20 in a row; 0 unreachable, 0 refused): metadata lists no join endpoint yet",
		"waiting for a join service #26 [unreachable] (0 in a row; 0 unreachable, 0 refused): 10.0.0.1:9090: connection refused",
		"still waiting for a join service #30 [unreachable] (30 in a row; 0 unreachable, 0 refused): 10.0.0.1:9090: connection refused",
		"join attempt refused #31 [refused] (0 in a row; 0 unreachable, 0 refused): 10.0.0.1:9090: rpc error: code = PermissionDenied",
		"waiting for a join service #32 [unreachable] (0 in a row; 0 unreachable, 0 refused): 10.0.0.1:9090: connection refused",
		"ticket received #33 [] (0 in a row; 31 unreachable, 1 refused): ",
	}, got)
}

func TestRetryGivesUp(t *testing.T) {
	permanent := errors.New("not fresh")
	var attempts int
	err := joinclient.Retry(context.Background(), clocktesting.NewFakeClock(time.Now()), joinclient.NewSchedule(joinclient.PollInterval, joinclient.NewBackoff), slog.New(slog.DiscardHandler), func(context.Context) error {
		attempts++
		return permanent
	})
	assert.ErrorIs(t, err, permanent)
	assert.Equal(t, 1, attempts)
}
