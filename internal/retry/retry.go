// Package retry runs the CLI's day-two steps again when they fail for a reason that passes
// by itself: an etcd leader election behind the API server ("request timed out", "leader
// changed"), an API server that restarts or is replaced (connection refused or reset, 503),
// a server asking the client to slow down (429, Retry-After), a platform API that is
// restarting. Every step retried here is idempotent (a second run after a lost answer finds
// the work done), so running it again is always safe; what is not transient fails at once.
//
// Waits grow exponentially with jitter, bounded by Policy.Max (and the caller's context), and
// never undercut a server's Retry-After. A failure names the first cause and the last one:
// the last retry's error alone often hides why the first attempt failed (a rate limit that the
// retries themselves ran into, after a refusal that said what was wrong).
package retry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strconv"
	"syscall"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"
)

// Clock is the time a retry loop waits on; k8s.io/utils/clock's clocks implement it, tests
// pass a fake one.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Policy is a bounded exponential back-off with jitter.
type Policy struct {
	// Initial is the first wait; each further wait is Factor times the one before, up to Max.
	Initial, Max time.Duration
	Factor       float64
	// Jitter adds up to this fraction of each wait at random, so that clients that failed
	// together do not retry together.
	Jitter float64
	// Clock is what the waits run on (the real clock when nil).
	Clock Clock
}

// Default is the policy of the CLI's calls to the API server and the platform: 0.5 s
// doubling to 10 s. An etcd leader election takes about a second, an API server restart a
// few; the caller's context bounds the whole.
var Default = Policy{Initial: 500 * time.Millisecond, Max: 10 * time.Second, Factor: 2, Jitter: 0.2}

// Backoff returns the sequence of waits of p (wait.Backoff.Step gives the next one).
func (p Policy) Backoff() *wait.Backoff {
	factor := p.Factor
	if factor < 1 {
		factor = 1
	}
	return &wait.Backoff{Duration: p.Initial, Factor: factor, Jitter: p.Jitter, Steps: math.MaxInt32, Cap: p.Max}
}

func (p Policy) clock() Clock {
	if p.Clock == nil {
		return realClock{}
	}
	return p.Clock
}

// Do runs op until it returns nil, an error that retryable says is permanent (nil retryable:
// Transient), or ctx ends. Between attempts it waits p's next back-off, or longer when the
// error carries a Retry-After (After). Its error is the permanent error itself when the first
// attempt failed for good; otherwise an *Error naming the first and the last distinct errors.
func Do(ctx context.Context, p Policy, retryable func(error) bool, op func(context.Context) error) error {
	if retryable == nil {
		retryable = Transient
	}
	clock := p.clock()
	backoff := p.Backoff()
	var h History
	for {
		err := op(ctx)
		if err == nil {
			return nil
		}
		h.Add(err)
		if !retryable(err) {
			if h.Attempts() == 1 {
				return err
			}
			return h.Err(nil)
		}
		delay := backoff.Step()
		if d, ok := After(err); ok && d > delay {
			delay = d
		}
		if deadline, ok := ctx.Deadline(); ok && clock.Now().Add(delay).After(deadline) {
			// Waiting would outlast the caller: say so now, with what failed.
			return h.Err(context.DeadlineExceeded)
		}
		select {
		case <-ctx.Done():
			return h.Err(ctx.Err())
		case <-clock.After(delay):
		}
	}
}

// History keeps what a retried step needs to report: how often it failed, its first error
// and its last one.
type History struct {
	attempts    int
	first, last error
}

// Add records a failed attempt (nil is ignored).
func (h *History) Add(err error) {
	if err == nil {
		return
	}
	h.attempts++
	if h.first == nil {
		h.first = err
	}
	h.last = err
}

// Attempts is the number of failed attempts recorded.
func (h *History) Attempts() int { return h.attempts }

// First and Last are the first and the latest error recorded (nil before any).
func (h *History) First() error { return h.first }
func (h *History) Last() error  { return h.last }

// String is "LAST" or "LAST (first error: FIRST)" when they differ, "" before any error.
func (h *History) String() string {
	if h.last == nil {
		return ""
	}
	if h.first.Error() == h.last.Error() {
		return h.last.Error()
	}
	return fmt.Sprintf("%v (first error: %v)", h.last, h.first)
}

// Err is the *Error of the attempts so far; stopped is why retrying stopped (the context's
// error), nil when the last error was permanent. Nil when nothing failed.
func (h *History) Err(stopped error) error {
	if h.last == nil {
		return stopped
	}
	return &Error{Attempts: h.attempts, First: h.first, Last: h.last, Stopped: stopped}
}

// Error is a step that failed after retries.
type Error struct {
	Attempts int
	// First and Last are the first and the last error (the same error when only one
	// attempt was made).
	First, Last error
	// Stopped is why retrying stopped: the context's error, or nil when Last was permanent.
	Stopped error
}

func (e *Error) Error() string {
	msg := e.Last.Error()
	if e.First != e.Last && e.First.Error() != e.Last.Error() {
		msg = fmt.Sprintf("%s (first error: %v)", msg, e.First)
	}
	switch {
	case e.Stopped != nil && e.Attempts > 1:
		return fmt.Sprintf("%s; gave up after %d attempts: %v", msg, e.Attempts, e.Stopped)
	case e.Stopped != nil:
		return fmt.Sprintf("%s; gave up: %v", msg, e.Stopped)
	case e.Attempts > 1:
		return fmt.Sprintf("%s (after %d attempts)", msg, e.Attempts)
	}
	return msg
}

// Unwrap makes errors.Is and errors.As see the last error, the first one and why it stopped.
func (e *Error) Unwrap() []error {
	out := []error{e.Last}
	if e.First != e.Last {
		out = append(out, e.First)
	}
	if e.Stopped != nil {
		out = append(out, e.Stopped)
	}
	return out
}

// Transient reports whether err is likely to pass if the same request is made again later,
// by typed checks only:
//   - API server status codes 429, 500, 502, 503, 504 (etcd leader changes and "request
//     timed out" reach the client as 500, an API server shutting down answers 503, a
//     request that outlived the server's timeout 504), and the reasons ServerTimeout,
//     Timeout, TooManyRequests;
//   - gRPC Unavailable and ResourceExhausted;
//   - a connection refused, reset or lost (EOF, HTTP/2 connection lost), a network timeout,
//     a request's own deadline.
//
// Permanent: every other status (permissions, invalid requests, not found, conflicts: the
// caller decides what those mean), context.Canceled, and errors of unknown kind. An error
// can say for itself by implementing Transient() bool.
func Transient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	var self interface{ Transient() bool }
	if errors.As(err, &self) {
		return self.Transient()
	}
	var apiStatus apierrors.APIStatus
	if errors.As(err, &apiStatus) {
		switch apiStatus.Status().Code {
		case http.StatusTooManyRequests, http.StatusInternalServerError, http.StatusBadGateway,
			http.StatusServiceUnavailable, http.StatusGatewayTimeout:
			return true
		}
		return apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err)
	}
	if s, ok := status.FromError(err); ok && s.Code() != 0 {
		return s.Code() == codes.Unavailable || s.Code() == codes.ResourceExhausted
	}
	if utilnet.IsConnectionRefused(err) || utilnet.IsConnectionReset(err) || utilnet.IsProbableEOF(err) ||
		utilnet.IsHTTP2ConnectionLost(err) || errors.Is(err, syscall.EPIPE) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	var netErr net.Error
	if errors.As(err, &netErr) && netErr.Timeout() {
		return true
	}
	return errors.Is(err, context.DeadlineExceeded)
}

// After is the delay a server asked for with its refusal: the API server's Retry-After
// (apierrors.SuggestsClientDelay), a gRPC status's RetryInfo, or an error's own
// RetryAfter() time.Duration.
func After(err error) (time.Duration, bool) {
	if err == nil {
		return 0, false
	}
	var self interface{ RetryAfter() time.Duration }
	if errors.As(err, &self) {
		if d := self.RetryAfter(); d > 0 {
			return d, true
		}
	}
	if secs, ok := apierrors.SuggestsClientDelay(err); ok && secs > 0 {
		return time.Duration(secs) * time.Second, true
	}
	if s, ok := status.FromError(err); ok {
		for _, d := range s.Details() {
			if info, ok := d.(*errdetails.RetryInfo); ok && info.GetRetryDelay() != nil {
				if d := info.GetRetryDelay().AsDuration(); d > 0 {
					return d, true
				}
			}
		}
	}
	return 0, false
}

// NotYet returns err marked transient: a condition a caller polls for that does not hold yet
// (nothing failed; asking again is the point).
func NotYet(err error) error { return notYet{err} }

type notYet struct{ error }

func (e notYet) Unwrap() error   { return e.error }
func (e notYet) Transient() bool { return true }

// WithDelay returns err carrying a server's requested delay, for After.
func WithDelay(err error, d time.Duration) error { return &delayed{err: err, d: d} }

type delayed struct {
	err error
	d   time.Duration
}

func (e *delayed) Error() string {
	return e.err.Error() + " (retry after " + strconv.FormatFloat(e.d.Seconds(), 'f', -1, 64) + "s)"
}
func (e *delayed) Unwrap() error             { return e.err }
func (e *delayed) RetryAfter() time.Duration { return e.d }
