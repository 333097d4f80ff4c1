package joinclient

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"

	"google.golang.org/grpc/credentials"

	"github.com/openconstellation/constellation/pkg/untrusted/untrustedgrpc"
)

// connObserver watches the connection of one attempt, to tell "nothing answered" from "a
// service answered". gRPC cannot tell us: a refused TCP connection and a failed attested
// handshake both end the RPC with codes.Unavailable and the cause flattened into the message
// (TestAttemptKinds). But gRPC calls the transport credentials' ClientHandshake only on an
// established TCP connection, so wrapping the credentials observes exactly that, and keeps
// the handshake's own error (an *atls.Error with its reason) for the log.
type connObserver struct {
	mu           sync.Mutex
	watched      bool  // the dialer wrapped its credentials: the rest is meaningful
	connected    bool  // a TCP connection was established
	handshaking  int   // attested handshakes started and not yet ended
	handshakeErr error // the first failed attested handshake
	// answered: the service sent a byte on some connection of the attempt.
	answered bool
	// resetUnanswered: the service reset a connection before it sent a byte. That is what a
	// service whose accept bounds are full does (internal/handshakelimit.AcceptLimiter resets
	// the connection inside Accept): it did no work for it, like a refused TCP connection.
	resetUnanswered bool
}

type observerKey struct{}

func withObserver(ctx context.Context, obs *connObserver) context.Context {
	return context.WithValue(ctx, observerKey{}, obs)
}

func observerFrom(ctx context.Context) *connObserver {
	obs, _ := ctx.Value(observerKey{}).(*connObserver)
	return obs
}

// watch returns creds reporting to obs.
func (o *connObserver) watch(creds credentials.TransportCredentials) credentials.TransportCredentials {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.watched = true
	return observedCredentials{TransportCredentials: creds, obs: o}
}

// classify turns the error of an attempt's call into its kind. Without observation every
// failure is a refusal: the cautious schedule. A status the service returned is the service's
// text: its message is made one bounded, escaped line before it is logged (untrusted.Status).
func (o *connObserver) classify(err error) *AttemptError {
	o.mu.Lock()
	defer o.mu.Unlock()
	err = untrustedgrpc.Status(err)
	switch {
	case o.watched && !o.connected:
		return &AttemptError{Kind: Unreachable, Err: err}
	case o.watched && o.resetUnanswered && !o.answered:
		return &AttemptError{Kind: Unreachable, Err: fmt.Errorf("the service reset the connection before answering (its connection bounds are full, or it is not serving): %w", o.handshakeErr)}
	case o.handshakeErr != nil:
		return &AttemptError{Kind: Refused, Err: o.handshakeErr}
	case o.handshaking > 0:
		return &AttemptError{Kind: Refused, Err: fmt.Errorf("the service accepted the connection but did not complete the attested handshake: %w", err)}
	default:
		return &AttemptError{Kind: Refused, Err: err}
	}
}

// observedCredentials are transport credentials that report each client handshake to obs.
type observedCredentials struct {
	credentials.TransportCredentials
	obs *connObserver
}

// ClientHandshake implements credentials.TransportCredentials.
func (c observedCredentials) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	c.obs.mu.Lock()
	c.obs.connected = true
	c.obs.handshaking++
	c.obs.mu.Unlock()
	observed := &readObserver{Conn: raw}
	conn, info, err := c.TransportCredentials.ClientHandshake(ctx, authority, observed)
	c.obs.mu.Lock()
	c.obs.handshaking--
	answered := observed.read.Load()
	c.obs.answered = c.obs.answered || answered
	if err != nil && c.obs.handshakeErr == nil {
		c.obs.handshakeErr = err
	}
	if err != nil && !answered && (errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)) {
		c.obs.resetUnanswered = true
	}
	c.obs.mu.Unlock()
	return conn, info, err
}

// readObserver records whether a byte was ever read from the connection.
type readObserver struct {
	net.Conn
	read atomic.Bool
}

func (r *readObserver) Read(p []byte) (int, error) {
	n, err := r.Conn.Read(p)
	if n > 0 {
		r.read.Store(true)
	}
	return n, err
}

// Clone implements credentials.TransportCredentials; the clone reports to the same observer.
func (c observedCredentials) Clone() credentials.TransportCredentials {
	return observedCredentials{TransportCredentials: c.TransportCredentials.Clone(), obs: c.obs}
}
