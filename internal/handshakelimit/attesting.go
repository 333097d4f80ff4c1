package handshakelimit

import (
	"fmt"
	"net/netip"
	"time"

	"google.golang.org/grpc"

	"github.com/openconstellation/constellation/pkg/atls"
	"github.com/openconstellation/constellation/pkg/attestation"
)

// AttestingLimits are the bounds of a node's server that attests to anonymous callers.
type AttestingLimits struct {
	// Accept bounds connections whose attested handshake has not finished (step 0); its
	// Timeout is the handshake deadline.
	Accept AcceptLimits
	// Handshakes admits attested handshakes once TLS is done, before the node quotes.
	Handshakes Limits
	// Attempts admits the calls that follow on a connection, which one connection can carry
	// any number of.
	Attempts Limits
}

// AttestingServer is what a node's server that attests to anonymous callers (the init
// server, the recovery server) serves with.
type AttestingServer struct {
	creds    *atls.Credentials
	accept   *AcceptLimiter
	attempts *Limiter
}

// NewAttestingServer builds attested-channel credentials whose connections pass limits.Accept
// when accepted and limits.Handshakes before the node quotes, and the limiter of the calls
// that follow (limits.Attempts). observe is told the accept-time outcomes
// (NewAcceptLimiter).
func NewAttestingServer(issuer attestation.Issuer, limits AttestingLimits, now func() time.Time, observe func(remote netip.Addr, outcome string)) (*AttestingServer, error) {
	accept, err := NewAcceptLimiter(limits.Accept, observe)
	if err != nil {
		return nil, err
	}
	handshakeLimiter, err := New(limits.Handshakes, now)
	if err != nil {
		return nil, err
	}
	attemptLimiter, err := New(limits.Attempts, now)
	if err != nil {
		return nil, err
	}
	creds, err := atls.NewCredentials(atls.Config{Issuer: issuer, Admit: handshakeLimiter.Admit, HandshakeTimeout: limits.Accept.Timeout})
	if err != nil {
		return nil, fmt.Errorf("attested-channel credentials: %w", err)
	}
	return &AttestingServer{creds: creds, accept: accept, attempts: attemptLimiter}, nil
}

// NewGRPCServer returns the gRPC server to serve with: attested-channel credentials, listeners
// through the AcceptLimiter.
func (a *AttestingServer) NewGRPCServer(opts ...grpc.ServerOption) *GRPCServer {
	return NewGRPCServer(a.accept, a.creds, opts...)
}

// Attempts is the limiter of the calls on established connections.
func (a *AttestingServer) Attempts() *Limiter { return a.attempts }

// AcceptLimiter is the limiter of connections whose handshake has not finished.
func (a *AttestingServer) AcceptLimiter() *AcceptLimiter { return a.accept }
