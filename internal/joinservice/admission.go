package joinservice

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc/credentials"

	"github.com/openconstellation/constellation/internal/atls"
	"github.com/openconstellation/constellation/internal/attestation"
)

// rateLimiter gives every peer address its own token bucket. Peers are told apart by IP: the
// limit applies before attestation, so there is no verified identity yet, and a flood from
// one address must not cost quotes and verifications (atls.Config.Admit).
type rateLimiter struct {
	limit rate.Limit
	burst int
	now   func() time.Time

	mu    sync.Mutex
	peers map[netip.Addr]*peerBucket
}

type peerBucket struct {
	limiter  *rate.Limiter
	lastSeen time.Time
}

// maxTrackedPeers bounds the limiter's memory; idle peers are forgotten first.
const maxTrackedPeers = 65536

func newRateLimiter(limit rate.Limit, burst int, now func() time.Time) *rateLimiter {
	return &rateLimiter{limit: limit, burst: burst, now: now, peers: map[netip.Addr]*peerBucket{}}
}

var errRateLimited = errors.New("rate limited")

func (r *rateLimiter) allow(addr netip.Addr) error {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	b, ok := r.peers[addr]
	if !ok {
		if len(r.peers) >= maxTrackedPeers {
			r.forgetIdle(now)
		}
		b = &peerBucket{limiter: rate.NewLimiter(r.limit, r.burst)}
		r.peers[addr] = b
	}
	b.lastSeen = now
	if !b.limiter.AllowN(now, 1) {
		return fmt.Errorf("%w: too many join attempts from %s (limit %.3g/s, burst %d); retry later", errRateLimited, addr, float64(r.limit), r.burst)
	}
	return nil
}

// forgetIdle drops peers whose bucket has refilled (they are indistinguishable from new ones)
// and, if that is not enough, every peer not seen since the mean last-seen time (at least the
// least recently seen one).
func (r *rateLimiter) forgetIdle(now time.Time) {
	refill := time.Duration(float64(r.burst) / float64(r.limit) * float64(time.Second))
	for a, b := range r.peers {
		if now.Sub(b.lastSeen) > refill {
			delete(r.peers, a)
		}
	}
	if len(r.peers) < maxTrackedPeers {
		return
	}
	var cutoff time.Time
	times := make([]time.Time, 0, len(r.peers))
	for _, b := range r.peers {
		times = append(times, b.lastSeen)
	}
	cutoff = meanTime(times)
	for a, b := range r.peers {
		if !b.lastSeen.After(cutoff) {
			delete(r.peers, a)
		}
	}
}

func meanTime(ts []time.Time) time.Time {
	var sum time.Duration
	base := ts[0]
	for _, t := range ts {
		sum += t.Sub(base) / time.Duration(len(ts))
	}
	return base.Add(sum)
}

// boundedValidator bounds how many validations run at once. Verifying costs CPU and memory;
// beyond the bound, handshakes wait (within their deadline) instead of piling up.
type boundedValidator struct {
	attestation.Validator
	slots chan struct{}
}

func (b boundedValidator) Validate(ctx context.Context, evidence []byte, purpose attestation.Purpose, data []byte) (*attestation.Verified, error) {
	select {
	case b.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for a verification slot: %w", ctx.Err())
	}
	defer func() { <-b.slots }()
	return b.Validator.Validate(ctx, evidence, purpose, data)
}

// observedCredentials logs and counts every handshake the join service refuses: a refused
// handshake is an admission decision, and gRPC would otherwise drop it silently.
type observedCredentials struct {
	*atls.Credentials
	svc *Service
}

func (o observedCredentials) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	start := o.svc.cfg.Now()
	conn, info, err := o.Credentials.ServerHandshake(raw)
	if err != nil {
		reason := "protocol"
		var e *atls.Error
		if errors.As(err, &e) {
			reason = e.Reason
			if reason == "refused" && errors.Is(err, errRateLimited) {
				reason = "rate-limited"
			}
		}
		o.svc.reject("handshake", remoteAddr(raw.RemoteAddr()), "", reason, err, start)
		return nil, nil, err
	}
	return conn, info, nil
}

func (o observedCredentials) Clone() credentials.TransportCredentials { return o }

func remoteAddr(a net.Addr) netip.Addr {
	if tcp, ok := a.(*net.TCPAddr); ok {
		addr, _ := netip.AddrFromSlice(tcp.IP)
		return addr.Unmap()
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}
