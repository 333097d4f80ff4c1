package azure

import (
	"context"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"

	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/retry"
)

// progressEvery is how often a wait says what it waits for.
const progressEvery = 5 * time.Second

// retryPolicy is the provider's own back-off around a whole call, for what the SDK's retries
// leave: throttling with a long Retry-After, and operations that failed on Azure's side.
var retryPolicy = retry.Policy{Initial: 2 * time.Second, Max: 30 * time.Second, Factor: 2, Jitter: 0.2}

// call runs op until it succeeds, fails for good, or ctx ends. A transient failure (Error)
// is retried after the wait Azure asked for or the back-off, whichever is longer; the wait is
// reported every progressEvery. The error names the first failure too when it differs from the
// last.
func (c *clients) call(ctx context.Context, what string, op func(context.Context) error) error {
	backoff := c.retry.Backoff()
	var h retry.History
	for {
		err := explain(what, op(ctx))
		if err == nil {
			return nil
		}
		h.Add(err)
		if !retry.Transient(err) {
			if h.Attempts() == 1 {
				return err
			}
			return h.Err(nil)
		}
		delay := backoff.Step()
		if d, ok := retry.After(err); ok && d > delay {
			delay = d
		}
		var said time.Time
		if err := c.sleep(ctx, delay, func(left time.Duration) {
			if said.IsZero() || due(said) {
				provider.Progressf(ctx, "Azure: %s: retrying in %s after: %v", what, left.Round(time.Second), err)
				said = time.Now()
			}
		}); err != nil {
			return h.Err(err)
		}
	}
}

// sleep waits d, calling report at its start and every second after (report decides whether
// a line is due).
func (c *clients) sleep(ctx context.Context, d time.Duration, report func(left time.Duration)) error {
	end := time.Now().Add(d)
	for {
		left := time.Until(end)
		if left <= 0 {
			return nil
		}
		if report != nil {
			report(left)
		}
		t := time.NewTimer(min(left, time.Second))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// wait polls a long-running operation to its end, as often as Azure asks (Retry-After) or
// pollEvery, saying at least every progressEvery what it waits for, and returns its result.
func wait[T any](ctx context.Context, c *clients, what string, p *runtime.Poller[T]) (T, error) {
	var zero T
	start, reported := time.Now(), time.Now()
	report := func(time.Duration) {
		if due(reported) {
			provider.Progressf(ctx, "Azure: waiting to %s (%s)", what, time.Since(start).Round(time.Second))
			reported = time.Now()
		}
	}
	for !p.Done() {
		resp, err := p.Poll(ctx)
		if err != nil {
			return zero, err
		}
		if p.Done() {
			break
		}
		delay := c.pollEvery
		if resp != nil {
			delay = max(delay, retryAfter(resp.Header))
		}
		if err := c.sleep(ctx, delay, report); err != nil {
			return zero, err
		}
	}
	return p.Result(ctx)
}

// due says whether a progress line is due, the last one said at last: every progressEvery,
// give or take the second sleep wakes up at.
func due(last time.Time) bool { return time.Since(last) >= progressEvery-time.Second/2 }

// put creates or updates a resource through a long-running operation and returns it:
// Resource Manager's PUT is idempotent, so a rerun converges on the same resource. A
// transient failure, also one the operation ends in, is retried.
func put[T any](ctx context.Context, c *clients, what string, begin func(context.Context) (*runtime.Poller[T], error)) (T, error) {
	var out T
	err := c.call(ctx, what, func(ctx context.Context) error {
		p, err := begin(ctx)
		if err != nil {
			return err
		}
		out, err = wait(ctx, c, what, p)
		return err
	})
	return out, err
}

// remove deletes a resource through a long-running operation; one that does not exist (or is
// gone before the operation ends) is removed already.
func remove[T any](ctx context.Context, c *clients, what string, begin func(context.Context) (*runtime.Poller[T], error)) error {
	return c.call(ctx, what, func(ctx context.Context) error {
		p, err := begin(ctx)
		if isNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if _, err := wait(ctx, c, what, p); err != nil && !isNotFound(err) {
			return err
		}
		return nil
	})
}

// get reads a resource; found is false if it does not exist.
func get[T any](ctx context.Context, c *clients, what string, read func(context.Context) (T, error)) (out T, found bool, err error) {
	err = c.call(ctx, what, func(ctx context.Context) error {
		var err error
		out, err = read(ctx)
		if isNotFound(err) {
			found = false
			return nil
		}
		found = err == nil
		return err
	})
	return out, found, err
}
