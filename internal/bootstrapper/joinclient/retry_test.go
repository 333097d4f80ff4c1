package joinclient_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/openconstellation/constellation/internal/bootstrapper/joinclient"
)

// The schedule on a fake clock: each attempt waits for the clock, the waits start at most
// 1 s, grow, and never exceed 30 s.
func TestRetrySchedule(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(0, 0))
	var mu sync.Mutex
	var at []time.Time
	const attempts = 12
	errc := make(chan error, 1)
	go func() {
		errc <- joinclient.Retry(context.Background(), clk, joinclient.NewBackoff(), func(context.Context) (bool, error) {
			mu.Lock()
			defer mu.Unlock()
			at = append(at, clk.Now())
			return len(at) == attempts, nil
		})
	}()
	for {
		select {
		case err := <-errc:
			require.NoError(t, err)
			require.Len(t, at, attempts)
			var waits []time.Duration
			for i := 1; i < len(at); i++ {
				waits = append(waits, at[i].Sub(at[i-1]))
			}
			assert.LessOrEqual(t, waits[0], joinclient.FirstDelayMax, "first wait")
			assert.Greater(t, waits[0], 700*time.Millisecond, "first wait")
			for i, w := range waits {
				assert.LessOrEqual(t, w, joinclient.MaxDelay, "wait %d", i)
				if i > 0 && waits[i-1] < 10*time.Second {
					assert.Greater(t, w, waits[i-1], "wait %d grows", i)
				}
			}
			assert.Greater(t, waits[len(waits)-1], 20*time.Second, "reaches the cap")
			return
		default:
		}
		// Advance the clock in small steps whenever the retry loop is waiting on it.
		if clk.HasWaiters() {
			clk.Step(10 * time.Millisecond)
		} else {
			time.Sleep(time.Millisecond)
		}
	}
}

// Init wins the node lock: the join loop stops during its wait, without another attempt.
func TestRetryStopsWhenCancelled(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(0, 0))
	ctx, cancel := context.WithCancel(context.Background())
	var calls int
	errc := make(chan error, 1)
	go func() {
		errc <- joinclient.Retry(ctx, clk, joinclient.NewBackoff(), func(context.Context) (bool, error) {
			calls++
			return false, errors.New("join service unavailable")
		})
	}()
	require.Eventually(t, clk.HasWaiters, 5*time.Second, time.Millisecond)
	cancel()
	assert.ErrorIs(t, <-errc, context.Canceled)
	assert.Equal(t, 1, calls)
}

func TestRetryGivesUp(t *testing.T) {
	permanent := errors.New("refused: wrong measurements")
	err := joinclient.Retry(context.Background(), clocktesting.NewFakeClock(time.Now()), joinclient.NewBackoff(), func(context.Context) (bool, error) {
		return true, permanent
	})
	assert.ErrorIs(t, err, permanent)
}
