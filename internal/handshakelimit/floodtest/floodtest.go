// Package floodtest is the attacker's side of handshake-limit tests: an issuer wrapper that
// counts (and can hold) the quotes a server makes, and clients that open attested handshakes
// from chosen loopback source addresses (127.0.0.0/8 is all loopback on Linux). Only tests
// import it.
package floodtest

import (
	"context"
	"net"
	"sync/atomic"
	"time"

	"github.com/openconstellation/constellation/pkg/atls"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// Issuer counts the Issue calls of the wrapped issuer. While Hold is open (not closed), calls
// wait in Issue after being counted: a server's handshakes then stay in progress until the
// test closes it.
type Issuer struct {
	attestation.Issuer
	Hold chan struct{} // nil: never hold

	issued, inFlight atomic.Int32
}

// Issue implements attestation.Issuer.
func (i *Issuer) Issue(ctx context.Context, purpose attestation.Purpose, data []byte) ([]byte, error) {
	i.issued.Add(1)
	i.inFlight.Add(1)
	defer i.inFlight.Add(-1)
	if i.Hold != nil {
		select {
		case <-i.Hold:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return i.Issuer.Issue(ctx, purpose, data)
}

// Issued is the number of Issue calls so far: the quotes the server was made to start.
func (i *Issuer) Issued() int { return int(i.issued.Load()) }

// InFlight is the number of Issue calls not yet returned.
func (i *Issuer) InFlight() int { return int(i.inFlight.Load()) }

// Validator counts Validate calls.
type Validator struct {
	attestation.Validator
	validated atomic.Int32
}

// Validate implements attestation.Validator.
func (v *Validator) Validate(ctx context.Context, evidence []byte, purpose attestation.Purpose, data []byte) (*attestation.Verified, error) {
	v.validated.Add(1)
	return v.Validator.Validate(ctx, evidence, purpose, data)
}

// Validated is the number of Validate calls so far.
func (v *Validator) Validated() int { return int(v.validated.Load()) }

// Attacker returns the credentials of a client without a TPM that makes a server do all it
// can: it demands the server's evidence (of variant v) and claims to attest with v, sending
// garbage.
func Attacker(v variant.Variant) *atls.Credentials {
	creds, err := atls.NewCredentials(atls.Config{
		Issuer:     garbageIssuer{v},
		Validators: []attestation.Validator{acceptAll{v}},
	})
	if err != nil {
		panic(err) // a constant configuration
	}
	return creds
}

type garbageIssuer struct{ v variant.Variant }

func (g garbageIssuer) Variant() variant.Variant { return g.v }
func (g garbageIssuer) Issue(context.Context, attestation.Purpose, []byte) ([]byte, error) {
	return []byte("not evidence"), nil
}

type acceptAll struct{ v variant.Variant }

func (a acceptAll) Variant() variant.Variant { return a.v }
func (a acceptAll) Validate(context.Context, []byte, attestation.Purpose, []byte) (*attestation.Verified, error) {
	return &attestation.Verified{Variant: a.v}, nil
}

// Handshake runs one client handshake with creds against addr from the source address local
// ("127.0.0.x") and closes the connection.
func Handshake(ctx context.Context, creds *atls.Credentials, local, addr string) error {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	conn, err := creds.Client(ctx, raw)
	if err != nil {
		return err
	}
	return conn.Close()
}

// Start starts one Handshake per source address in locals, all at once (each within
// timeout), and returns a channel that receives each result as its handshake ends.
func Start(creds *atls.Credentials, addr string, locals []string, timeout time.Duration) <-chan error {
	results := make(chan error, len(locals))
	for _, local := range locals {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			results <- Handshake(ctx, creds, local, addr)
		}()
	}
	return results
}

// Collect receives n results from Start.
func Collect(results <-chan error, n int) []error {
	out := make([]error, n)
	for i := range out {
		out[i] = <-results
	}
	return out
}

// Flood runs Start and returns all results once every handshake ended.
func Flood(creds *atls.Credentials, addr string, locals []string, timeout time.Duration) []error {
	return Collect(Start(creds, addr, locals, timeout), len(locals))
}

// Repeat returns n copies of local: n handshakes from one peer.
func Repeat(local string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = local
	}
	return out
}
