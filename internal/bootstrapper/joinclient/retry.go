// Package joinclient is the node side of joining a cluster: it asks the platform's metadata
// where join services are, dials them over the mutually attested channel until one issues a
// ticket, and stops as soon as the node lock is taken by init instead.
//
// # When to try again
//
// A node usually boots before its cluster's join service runs, so most failed attempts meet
// nothing at all. Every failed attempt is one of two kinds, and each kind has its own wait:
//
//   - Unreachable: no join service answered. Metadata lists no endpoint yet or cannot be
//     read, or no listed endpoint accepted the TCP connection (refused, no route, dial
//     timeout), or the service reset the connection before it sent a byte (what its accept
//     bounds do to a connection over them, internal/handshakelimit.AcceptLimiter). Nothing on
//     the service's side did any work, so the node polls at a short fixed interval
//     (PollInterval, 0.5 s ± 20 %) and is admitted within about that interval of the service
//     starting to listen or having room.
//   - Refused: some service answered and gave no ticket: the attested handshake failed
//     either way (the service's handshake limiter refused or rate-limited the node, the
//     service rejected the node's evidence, the node rejected the service's), the RPC
//     returned a status (PermissionDenied, InvalidArgument, Unavailable because the
//     service's key service or API server is down, ...), the ticket was invalid or from
//     another cluster, or the connection was accepted and then hung, closed, or reset after
//     the service had sent something. A handshake
//     costs the service a TPM quote or at least a turn of its per-peer handshake budget
//     (internal/handshakelimit: 1/s, burst 5), so the node backs off exponentially: from at
//     most FirstDelayMax, doubling, capped at MaxDelay, with jitter.
//
// The first refusal starts the exponential schedule from its start, however many unreachable
// attempts came before. Once refused, the node stays on that schedule until it gets a ticket:
// an unreachable attempt after a refusal waits as long as the last refusal did (it neither
// grows nor resets the back-off), so a service that refused and then went away is not polled
// at the fast interval when it comes back. An attempt that tries several endpoints is a
// refusal if any of them answered.
//
// What counts as "answered" is observed, not parsed from error text: gRPC reports a refused
// TCP connection and a failed attested handshake alike, as codes.Unavailable with a flattened
// message, and the service itself returns Unavailable when its dependencies are down. So
// AttestedDialer wraps its transport credentials for each attempt: gRPC starts the
// credentials' handshake only on an established TCP connection, which is exactly "something
// answered" (TestAttemptKinds pins this against a real gRPC server with the aTLS
// credentials). gRPC's own connection state is not used to wait for readiness: a long-lived
// connection would retry on gRPC's reconnect back-off (1 s growing to 120 s) and hide the
// attempts' kinds, so every attempt is one fresh attested connection (fresh evidence), one
// RPC that fails fast, and the connection closed after it.
//
// Every refused attempt is logged with its reason. Unreachable attempts are logged when a
// streak starts or its reason changes, then every unreachableLogEvery-th attempt with the
// count, so a node waiting a minute for its cluster writes a dozen lines, not a hundred.
package joinclient

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"math/rand/v2"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"
)

// Poll schedule while no join service answers: PollInterval ± PollJitter (a fraction), so
// nodes booted together spread their knocks; a refused TCP connection costs the service
// nothing, so the interval stays short and does not grow.
const (
	PollInterval = 500 * time.Millisecond
	PollJitter   = 0.2
)

// Back-off schedule after a refusal: exponential from at most 1 s, doubling, capped at 30 s,
// with jitter so that a hundred nodes refused together do not come back in lockstep.
// wait.Backoff adds jitter on top of the base delay (up to Jitter × delay), so the base
// starts at 0.8 s and caps at 24 s: delays stay within (0.8 s, 1 s] at first and never
// exceed 30 s.
const (
	FirstDelayMax = time.Second
	MaxDelay      = 30 * time.Second
	backoffJitter = 0.25
)

// unreachableLogEvery: during a streak of unreachable attempts, every this many attempts are
// summarized in one log line.
const unreachableLogEvery = 10

// NewBackoff returns the back-off schedule after refusals.
func NewBackoff() wait.Backoff {
	return wait.Backoff{
		Duration: time.Duration(float64(FirstDelayMax) / (1 + backoffJitter)),
		Factor:   2,
		Jitter:   backoffJitter,
		Cap:      time.Duration(float64(MaxDelay) / (1 + backoffJitter)),
		Steps:    math.MaxInt32,
	}
}

// Kind is the kind of a failed attempt.
type Kind int

// Kinds of failed attempts (see the package documentation).
const (
	// Unreachable: no join service answered.
	Unreachable Kind = iota + 1
	// Refused: a service answered and gave no (valid) ticket.
	Refused
)

func (k Kind) String() string {
	switch k {
	case Unreachable:
		return "unreachable"
	case Refused:
		return "refused"
	}
	return "unknown"
}

// AttemptError is a failed attempt that Retry tries again.
type AttemptError struct {
	Kind Kind
	Err  error
}

func (e *AttemptError) Error() string { return e.Kind.String() + ": " + e.Err.Error() }

func (e *AttemptError) Unwrap() error { return e.Err }

// Schedule decides the wait after each failed attempt, from the kinds of the attempts so far.
// It is not safe for concurrent use; one Retry loop owns it.
type Schedule struct {
	poll    time.Duration
	backoff func() wait.Backoff
	rand    func() float64

	refusing bool
	// next is the refusal back-off's state; last its state before the latest refusal, so an
	// unreachable attempt while refusing waits as long as that refusal did.
	next, last wait.Backoff
}

// NewSchedule returns a schedule polling every poll (± PollJitter) while attempts are
// unreachable, and on the back-off schedule from backoff once an attempt was refused.
func NewSchedule(poll time.Duration, backoff func() wait.Backoff) *Schedule {
	return &Schedule{poll: poll, backoff: backoff, rand: rand.Float64}
}

// Wait returns how long to wait after a failed attempt of kind k.
func (s *Schedule) Wait(k Kind) time.Duration {
	if k == Refused {
		if !s.refusing {
			s.refusing = true
			s.next = s.backoff()
		}
		s.last = s.next
		return s.next.Step()
	}
	if s.refusing {
		again := s.last
		return again.Step()
	}
	return time.Duration(float64(s.poll) * (1 + PollJitter*(2*s.rand()-1)))
}

// Retry calls attempt until it succeeds, waiting on clk between attempts as s says for the
// kind of each failure (an *AttemptError). It returns ctx's error when ctx ends first (for
// example because init won the node lock), and attempt's error when that is not an
// *AttemptError (attempt gives up). It logs every failed attempt to log, unreachable ones
// summarized, and the success with the counts of failed attempts before it.
func Retry(ctx context.Context, clk clock.Clock, s *Schedule, log *slog.Logger, attempt func(ctx context.Context) error) error {
	var attempts, unreachable, refused int
	var streak streak
	for {
		attempts++
		err := attempt(ctx)
		if err == nil {
			log.Info("ticket received", "attempt", attempts, "unreachableAttempts", unreachable, "refusedAttempts", refused)
			return nil
		}
		var failed *AttemptError
		if !errors.As(err, &failed) {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		delay := s.Wait(failed.Kind)
		if failed.Kind == Refused {
			refused++
			streak = streak.end()
			log.Warn("join attempt refused", "kind", failed.Kind.String(), "attempt", attempts, "reason", failed.Err, "retryIn", delay)
		} else {
			unreachable++
			var summarize bool
			streak, summarize = streak.add(clk.Now(), failed.Err.Error())
			switch {
			case streak.count == 1 || streak.reasonChanged:
				log.Info("waiting for a join service", "kind", failed.Kind.String(), "attempt", attempts, "reason", failed.Err, "retryIn", delay)
			case summarize:
				log.Info("still waiting for a join service", "kind", failed.Kind.String(), "attempt", attempts,
					"unreachableInARow", streak.count, "waited", clk.Since(streak.start).Round(time.Millisecond), "reason", failed.Err)
			}
		}
		timer := clk.NewTimer(delay)
		select {
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-timer.C():
		}
	}
}

// streak is a run of unreachable attempts, for the log.
type streak struct {
	count         int
	start         time.Time
	reason        string
	reasonChanged bool
}

// add counts an unreachable attempt at now with reason, and says whether this attempt is
// one to summarize.
func (s streak) add(now time.Time, reason string) (streak, bool) {
	if s.count == 0 {
		s.start = now
	}
	s.count++
	s.reasonChanged = s.count > 1 && reason != s.reason
	s.reason = reason
	return s, s.count%unreachableLogEvery == 0
}

func (s streak) end() streak { return streak{} }
