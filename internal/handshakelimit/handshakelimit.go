// Package handshakelimit decides, before a server does any expensive work for a peer (a TPM
// quote, a verification, a bcrypt comparison), whether it does that work at all.
//
// A server that attests answers every caller with a TPM quote, and one that verifies pays a
// verification for every caller: without a bound, whoever reaches the port decides how busy
// the TPM and the CPU are. A Limiter bounds, in this order:
//
//  1. the rate of attempts per peer: a token bucket per peer, every attempt spends a token;
//  2. the attempts one peer has in progress at once;
//  3. the attempts in progress across all peers: Concurrent do their work, up to Waiting
//     more wait for a slot (within their own deadline), and any further one is refused at
//     once.
//
// A refusal costs a map lookup. Peers are told apart by source address (there is no verified
// identity before the work the limiter guards): an IPv4 address, or the /64 prefix of an IPv6
// address, because one host commonly owns a whole /64 and could otherwise spread a flood over
// 2^64 addresses. The table of peers is bounded (Limits.MaxPeers, default MaxTrackedPeers):
// idle peers are forgotten to make room, and when none can be (every tracked peer has an
// attempt in progress) a new peer is refused rather than inserted.
//
// Before all of that, at accept time, an AcceptLimiter bounds the connections whose handshake
// has not finished, per peer and in all, and closes them at the handshake deadline: a
// connection that stalls before TLS costs a goroutine and buffers, and a Limiter is only
// asked once TLS is done. Servers get both through NewGRPCServer (NewAttestingServer for the
// node's servers that attest to anonymous callers) or NewHTTPServer.
package handshakelimit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Refusals; each error a Limiter returns wraps exactly one of them.
var (
	// ErrRateLimited: the peer's token bucket is empty.
	ErrRateLimited = errors.New("rate limited")
	// ErrPeerBusy: the peer already has Limits.PerPeer attempts in progress.
	ErrPeerBusy = errors.New("too many concurrent attempts from this peer")
	// ErrBusy: the server has Limits.Concurrent attempts working and Limits.Waiting waiting.
	ErrBusy = errors.New("server busy")
	// ErrTableFull: the peer is new and the table of peers is full of peers that cannot be
	// forgotten (each has an attempt in progress).
	ErrTableFull = errors.New("too many peers at once")
)

// Reason labels a refusal for logs and metrics: "rate-limited", "peer-busy", "busy" or
// "peer-table-full"; "" when err is not a refusal of a Limiter.
func Reason(err error) string {
	switch {
	case errors.Is(err, ErrTableFull):
		return "peer-table-full"
	case errors.Is(err, ErrRateLimited):
		return "rate-limited"
	case errors.Is(err, ErrPeerBusy):
		return "peer-busy"
	case errors.Is(err, ErrBusy):
		return "busy"
	}
	return ""
}

// MaxTrackedPeers is the default bound of the table of peers (about 100 bytes each) and the
// largest one allowed.
const MaxTrackedPeers = 65536

// Limits configures a Limiter. Zero values are invalid, except Waiting.
type Limits struct {
	// Rate is the sustained rate of attempts per peer (per second; rate.Inf: unlimited);
	// Burst the attempts a peer may make at once after being idle.
	Rate  rate.Limit
	Burst int
	// PerPeer bounds the attempts one peer has in progress (working or waiting).
	PerPeer int
	// Concurrent bounds the attempts working at once across all peers; Waiting more may wait
	// for a slot, further ones are refused at once.
	Concurrent int
	Waiting    int
	// What names the attempts in refusals, e.g. "join attempts" (default "handshakes").
	What string
	// MaxPeers bounds the table of peers (0: MaxTrackedPeers). It must exceed
	// Concurrent+Waiting, the most peers that can have attempts in progress, or a full table
	// of busy peers would turn every new peer away (ErrTableFull) while old ones wait.
	MaxPeers int
}

// Or returns l with every unset limit (zero or negative; What empty) taken from defaults: a
// server's configuration sets what it wants and keeps its defaults for the rest.
func (l Limits) Or(defaults Limits) Limits {
	if l.Rate <= 0 {
		l.Rate = defaults.Rate
	}
	for _, f := range []struct{ v, d *int }{
		{&l.Burst, &defaults.Burst}, {&l.PerPeer, &defaults.PerPeer}, {&l.Concurrent, &defaults.Concurrent}, {&l.Waiting, &defaults.Waiting},
		{&l.MaxPeers, &defaults.MaxPeers},
	} {
		if *f.v <= 0 {
			*f.v = *f.d
		}
	}
	if l.What == "" {
		l.What = defaults.What
	}
	return l
}

// Validate names every limit out of range.
func (l Limits) Validate() error {
	var problems []error
	if l.Rate <= 0 {
		problems = append(problems, fmt.Errorf("rate %v per second: must be positive", float64(l.Rate)))
	}
	for _, c := range []struct {
		name string
		v    int
		min  int
	}{{"burst", l.Burst, 1}, {"per-peer concurrency", l.PerPeer, 1}, {"concurrency", l.Concurrent, 1}, {"waiting", l.Waiting, 0}, {"peer table", l.MaxPeers, 0}} {
		if c.v < c.min {
			problems = append(problems, fmt.Errorf("%s %d: must be at least %d", c.name, c.v, c.min))
		}
	}
	if l.MaxPeers > MaxTrackedPeers {
		problems = append(problems, fmt.Errorf("peer table %d: must be at most %d", l.MaxPeers, MaxTrackedPeers))
	}
	if len(problems) > 0 {
		return fmt.Errorf("handshake limits: %w", errors.Join(problems...))
	}
	return nil
}

// Limiter admits attempts within Limits. It is safe for concurrent use.
type Limiter struct {
	limits Limits
	now    func() time.Time
	slots  chan struct{} // one per working attempt

	mu       sync.Mutex
	peers    map[netip.Prefix]*peer
	admitted int // working or waiting
}

type peer struct {
	bucket   *rate.Limiter
	lastSeen time.Time
	active   int // attempts in progress (working or waiting)
}

// New checks limits and returns a Limiter reading time from now (time.Now when nil).
func New(limits Limits, now func() time.Time) (*Limiter, error) {
	if err := limits.Validate(); err != nil {
		return nil, err
	}
	if limits.What == "" {
		limits.What = "handshakes"
	}
	if limits.MaxPeers == 0 {
		limits.MaxPeers = MaxTrackedPeers
	}
	if now == nil {
		now = time.Now
	}
	return &Limiter{limits: limits, now: now, slots: make(chan struct{}, limits.Concurrent), peers: map[netip.Prefix]*peer{}}, nil
}

// Limits returns the limits in force.
func (l *Limiter) Limits() Limits { return l.limits }

// Admit decides on an attempt from remote (its source address; any net.Addr, so it fits
// atls.Config.Admit). On success the attempt holds a working slot until it calls release
// (exactly once counts; later calls do nothing). It waits for a slot at most until ctx ends.
func (l *Limiter) Admit(ctx context.Context, remote net.Addr) (release func(), err error) {
	return l.AdmitAddr(ctx, AddrOf(remote))
}

// AdmitAddr is Admit for a parsed address. The zero Addr (an address that is not IP, such as
// an in-memory pipe) is one peer.
func (l *Limiter) AdmitAddr(ctx context.Context, addr netip.Addr) (release func(), err error) {
	key := PeerKey(addr)
	p, err := l.reserve(key, addr)
	if err != nil {
		return nil, err
	}
	select {
	case l.slots <- struct{}{}:
	case <-ctx.Done():
		l.unreserve(p)
		return nil, fmt.Errorf("%w: waited for a slot until the deadline (%d %s at once); retry later: %w", ErrBusy, l.limits.Concurrent, l.limits.What, ctx.Err())
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			<-l.slots
			l.unreserve(p)
		})
	}, nil
}

// reserve applies the rate, per-peer and total bounds, and counts the attempt in.
func (l *Limiter) reserve(key netip.Prefix, addr netip.Addr) (*peer, error) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	p, ok := l.peers[key]
	if !ok {
		if len(l.peers) >= l.limits.MaxPeers {
			l.forgetIdle(now)
		}
		// Nothing could be forgotten: every tracked peer has an attempt in progress. Turning
		// the new peer away keeps the bound (and the rate state of the busy ones, which
		// forgetting would reset).
		if len(l.peers) >= l.limits.MaxPeers {
			return nil, fmt.Errorf("%w: %d peers with %s in progress (limit %d); retry later", ErrTableFull, len(l.peers), l.limits.What, l.limits.MaxPeers)
		}
		p = &peer{bucket: rate.NewLimiter(l.limits.Rate, l.limits.Burst)}
		l.peers[key] = p
	}
	p.lastSeen = now
	if !p.bucket.AllowN(now, 1) {
		return nil, fmt.Errorf("%w: too many %s from %s (limit %.3g/s, burst %d); retry later", ErrRateLimited, l.limits.What, describe(addr, key), float64(l.limits.Rate), l.limits.Burst)
	}
	if p.active >= l.limits.PerPeer {
		return nil, fmt.Errorf("%w: %s already has %d %s in progress (limit %d); retry later", ErrPeerBusy, describe(addr, key), p.active, l.limits.What, l.limits.PerPeer)
	}
	if total := l.limits.Concurrent + l.limits.Waiting; l.admitted >= total {
		return nil, fmt.Errorf("%w: %d %s in progress (limit %d working, %d waiting); retry later", ErrBusy, l.admitted, l.limits.What, l.limits.Concurrent, l.limits.Waiting)
	}
	p.active++
	l.admitted++
	return p, nil
}

func (l *Limiter) unreserve(p *peer) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p.active--
	l.admitted--
}

// InProgress returns the attempts admitted and not yet released (working or waiting).
func (l *Limiter) InProgress() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.admitted
}

// Tracked returns the number of peers in the table.
func (l *Limiter) Tracked() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.peers)
}

// forgetIdle makes room in the table: first peers whose bucket has refilled (they are
// indistinguishable from new ones), then, if that is not enough, every idle peer not seen
// since the mean last-seen time, and if that forgot none either (the oldest peers are the
// busy ones), the least recently seen idle peer. Peers with attempts in progress stay:
// forgetting them would forget their per-peer count. There are at most Concurrent+Waiting of
// those, normally far fewer than MaxPeers; if they fill the table, reserve refuses new peers.
func (l *Limiter) forgetIdle(now time.Time) {
	refill := time.Duration(float64(l.limits.Burst) / float64(l.limits.Rate) * float64(time.Second))
	for k, p := range l.peers {
		if p.active == 0 && now.Sub(p.lastSeen) > refill {
			delete(l.peers, k)
		}
	}
	if len(l.peers) < l.limits.MaxPeers {
		return
	}
	var sum time.Duration
	var base time.Time
	for _, p := range l.peers {
		base = p.lastSeen
		break
	}
	for _, p := range l.peers {
		sum += p.lastSeen.Sub(base) / time.Duration(len(l.peers))
	}
	cutoff := base.Add(sum)
	var oldest netip.Prefix
	var oldestSeen time.Time
	found := false
	for k, p := range l.peers {
		if p.active != 0 {
			continue
		}
		if !p.lastSeen.After(cutoff) {
			delete(l.peers, k)
		} else if !found || p.lastSeen.Before(oldestSeen) {
			oldest, oldestSeen, found = k, p.lastSeen, true
		}
	}
	if len(l.peers) >= l.limits.MaxPeers && found {
		delete(l.peers, oldest)
	}
}

// PeerKey is the table key of addr: the address itself for IPv4 (also IPv4-mapped IPv6), its
// /64 prefix for IPv6, the zero Prefix for the zero Addr.
func PeerKey(addr netip.Addr) netip.Prefix {
	addr = addr.Unmap()
	switch {
	case !addr.IsValid():
		return netip.Prefix{}
	case addr.Is4():
		return netip.PrefixFrom(addr, 32)
	default:
		p, _ := addr.WithZone("").Prefix(64)
		return p
	}
}

// AddrOf returns the IP address of a network address: a *net.TCPAddr or *net.UDPAddr, or
// anything whose String is host:port; the zero Addr otherwise.
func AddrOf(a net.Addr) netip.Addr {
	switch a := a.(type) {
	case nil:
		return netip.Addr{}
	case *net.TCPAddr:
		addr, _ := netip.AddrFromSlice(a.IP)
		return addr.Unmap()
	case *net.UDPAddr:
		addr, _ := netip.AddrFromSlice(a.IP)
		return addr.Unmap()
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

func describe(addr netip.Addr, key netip.Prefix) string {
	switch {
	case !addr.IsValid():
		return "a peer without an IP address"
	case addr.Is4():
		return addr.String()
	default:
		return key.String()
	}
}
