// Package floodtest is the attacker's side of handshake-limit tests: an issuer wrapper that
// counts (and can hold) the quotes a server makes, and clients that open attested handshakes
// from chosen loopback source addresses (127.0.0.0/8 is all loopback on Linux). Only tests
// import it.
package floodtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync/atomic"
	"syscall"
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

// HalfClientHello is the start of a TLS record that announces a 16 KiB ClientHello (the
// largest record a server must accept before the handshake) and then a few bytes of it: a
// server's TLS stack reserves the whole record and waits for the rest.
var HalfClientHello = []byte{0x16, 0x03, 0x01, 0x40, 0x00, 0x01, 0x00, 0x3f, 0xfc, 0x03, 0x03}

// Stall opens a TCP connection to addr from the source address local ("127.0.0.x") and
// sends send (nothing when nil), then nothing more. It returns the connection, or nil when
// the server reset it already while it was set up (a refusal at accept time can reach the
// dial).
func Stall(local, addr string, send []byte) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 30 * time.Second}
	c, err := d.Dial("tcp", addr)
	if errors.Is(err, syscall.ECONNRESET) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if len(send) > 0 {
		if _, err := c.Write(send); err != nil {
			c.Close()
			if errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
				return nil, nil
			}
			return nil, err
		}
	}
	return c, nil
}

// Stalled are the connections of StallAll.
type Stalled struct {
	// Open are the connections set up (some may be closed by the server already).
	Open []net.Conn
	// ResetAtDial counts the connections the server reset while they were set up.
	ResetAtDial int
}

// StallAll runs Stall once per source address in locals (sequentially: the order of the
// flood is the order of locals), alternating between sending nothing and HalfClientHello
// when half is set.
func StallAll(locals []string, addr string, half bool) (*Stalled, error) {
	s := &Stalled{}
	for i, local := range locals {
		var send []byte
		if half && i%2 == 1 {
			send = HalfClientHello
		}
		c, err := Stall(local, addr, send)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("stalled connection %d from %s: %w", i, local, err)
		}
		if c == nil {
			s.ResetAtDial++
			continue
		}
		s.Open = append(s.Open, c)
	}
	return s, nil
}

// Close closes every connection.
func (s *Stalled) Close() {
	for _, c := range s.Open {
		c.Close()
	}
}

// ClosedByServer counts the connections the server has closed (EOF or reset), waiting at most
// wait for each one that is still open.
func (s *Stalled) ClosedByServer(wait time.Duration) int {
	n := s.ResetAtDial
	for _, c := range s.Open {
		if Closed(c, wait) {
			n++
		}
	}
	return n
}

// Closed reports whether the server closed c within wait: a read ends with EOF or a reset
// rather than at the read deadline.
func Closed(c net.Conn, wait time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, 512)
	for {
		_, err := c.Read(buf)
		if err == nil {
			continue // what the server sent before closing (an alert, HTTP/2 settings)
		}
		var ne net.Error
		return !errors.As(err, &ne) || !ne.Timeout()
	}
}

// Locals returns n source addresses 127.x.y.z from base ("127.0.0.0"), one per peer.
func Locals(base string, n int) []string {
	ip := net.ParseIP(base).To4()
	start := uint32(ip[0])<<24 | uint32(ip[1])<<16 | uint32(ip[2])<<8 | uint32(ip[3])
	out := make([]string, n)
	for i := range out {
		v := start + uint32(i) + 1
		out[i] = net.IPv4(byte(v>>24), byte(v>>16), byte(v>>8), byte(v)).String()
	}
	return out
}

// Goroutines waits until the process runs at most want goroutines, up to wait; it returns
// the last count.
func Goroutines(want int, wait time.Duration) int {
	deadline := time.Now().Add(wait)
	for {
		n := runtime.NumGoroutine()
		if n <= want || time.Now().After(deadline) {
			return n
		}
		time.Sleep(20 * time.Millisecond)
	}
}
