// Package joinclient is the node side of joining a cluster: it asks the platform's metadata
// where join services are, dials them over the mutually attested channel until one issues a
// ticket, and stops as soon as the node lock is taken by init instead.
package joinclient

import (
	"context"
	"math"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"
)

// Retry schedule: exponential from at most 1 s, doubling, capped at 30 s, with jitter so
// that a hundred nodes booted together do not knock on the join service in lockstep.
// wait.Backoff adds jitter on top of the base delay (up to Jitter × delay), so the base
// starts at 0.8 s and caps at 24 s: delays stay within (0.8 s, 1 s] at first and never
// exceed 30 s.
const (
	FirstDelayMax = time.Second
	MaxDelay      = 30 * time.Second
	backoffJitter = 0.25
)

// NewBackoff returns the join retry schedule.
func NewBackoff() wait.Backoff {
	return wait.Backoff{
		Duration: time.Duration(float64(FirstDelayMax) / (1 + backoffJitter)),
		Factor:   2,
		Jitter:   backoffJitter,
		Cap:      time.Duration(float64(MaxDelay) / (1 + backoffJitter)),
		Steps:    math.MaxInt32,
	}
}

// Retry calls attempt until it reports done, waiting on clk between attempts as backoff
// says. It returns ctx's error when ctx ends first (for example because init won the node
// lock), and attempt's error when attempt gives up (done with an error).
func Retry(ctx context.Context, clk clock.Clock, backoff wait.Backoff, attempt func(ctx context.Context) (done bool, err error)) error {
	for {
		done, err := attempt(ctx)
		if done {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		timer := clk.NewTimer(backoff.Step())
		select {
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-timer.C():
		}
	}
}
