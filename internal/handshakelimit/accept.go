package handshakelimit

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Step 0, before TLS. Limiter is asked once a connection's TLS handshake is done, so a peer
// that opens TCP connections and never completes TLS (sends nothing, or half a ClientHello)
// reaches no Limiter: each such connection holds a server goroutine and its buffers until the
// handshake deadline. An AcceptLimiter bounds these pending connections when they are
// accepted, with the same notion of peer as Limiter (IPv4 address, IPv6 /64):
//
//   - PerPeer: a peer with that many pending connections has further ones refused;
//   - Total: with that many pending in all, a newcomer displaces the oldest pending connection
//     of a peer holding more pending connections than the newcomer's peer (so one peer, or a
//     few, cannot hold every slot while a peer with none waits), or is refused if there is
//     none;
//   - Timeout: a connection whose handshake has not finished by then is closed.
//
// A refused connection is closed at once inside Accept, so it never reaches the server and
// costs no goroutine. A connection stops being pending when the server says its handshake has
// finished (GRPCServer: the attested handshake and the HTTP/2 preface; HTTP: the first request
// header) or when it is closed. The table of peers holds only peers with pending connections,
// so it never has more than Total entries: there is nothing to forget, and a full table is the
// Total bound.

// Accept-time outcomes, as reported to the observer and counted.
const (
	// AcceptPeerBusy: the peer had AcceptLimits.PerPeer pending connections.
	AcceptPeerBusy = "peer-busy"
	// AcceptBusy: Total pending, and no peer holds more than the newcomer's peer.
	AcceptBusy = "busy"
	// AcceptDisplaced: a pending connection closed to make room for a peer with fewer.
	AcceptDisplaced = "displaced"
	// AcceptTimeout: a pending connection closed because its handshake took longer than
	// AcceptLimits.Timeout.
	AcceptTimeout = "timeout"
)

var acceptOutcomes = [...]string{AcceptPeerBusy, AcceptBusy, AcceptDisplaced, AcceptTimeout}

// AcceptLimits configures an AcceptLimiter. Zero values are invalid.
type AcceptLimits struct {
	// PerPeer bounds one peer's pending connections.
	PerPeer int
	// Total bounds all pending connections (at most MaxTrackedPeers).
	Total int
	// Timeout is the handshake deadline: a connection still pending this long after it was
	// accepted is closed.
	Timeout time.Duration
}

// Or returns l with every unset limit (zero or negative) taken from defaults.
func (l AcceptLimits) Or(defaults AcceptLimits) AcceptLimits {
	if l.PerPeer <= 0 {
		l.PerPeer = defaults.PerPeer
	}
	if l.Total <= 0 {
		l.Total = defaults.Total
	}
	if l.Timeout <= 0 {
		l.Timeout = defaults.Timeout
	}
	return l
}

// Validate names every limit out of range.
func (l AcceptLimits) Validate() error {
	var problems []error
	if l.PerPeer < 1 {
		problems = append(problems, fmt.Errorf("pending connections per peer %d: must be at least 1", l.PerPeer))
	}
	if l.Total < 1 || l.Total > MaxTrackedPeers {
		problems = append(problems, fmt.Errorf("pending connections %d: must be 1..%d", l.Total, MaxTrackedPeers))
	}
	if l.Timeout <= 0 {
		problems = append(problems, fmt.Errorf("handshake timeout %v: must be positive", l.Timeout))
	}
	if len(problems) > 0 {
		return fmt.Errorf("accept limits: %w", errors.Join(problems...))
	}
	return nil
}

// AcceptLimiter bounds a server's pending connections (see AcceptLimits). It is safe for
// concurrent use; one limiter may guard several listeners of a server, which then share its
// bounds.
type AcceptLimiter struct {
	limits  AcceptLimits
	observe func(remote netip.Addr, outcome string)
	counts  [len(acceptOutcomes)]atomic.Int64

	mu    sync.Mutex
	peers map[netip.Prefix]*pendingPeer
	// withCount[c] is the number of peers with c pending connections (1..PerPeer): the
	// largest holder is found without a scan.
	withCount []int
	// oldest..newest: the pending connections in accept order.
	oldest, newest *pendingConn
	pending        int
	// byAddrs finds a pending connection by its addresses: gRPC tells a finished handshake
	// by addresses only (stats.ConnTagInfo).
	byAddrs map[connAddrs]*pendingConn
}

type pendingPeer struct{ count int }

type connAddrs struct{ local, remote string }

// NewAcceptLimiter checks limits and returns a limiter. observe, when set, is told every
// refusal, displacement and timeout, with the peer's address, before the connection is
// closed (outside the limiter's lock, on the accepting goroutine or the timer's).
func NewAcceptLimiter(limits AcceptLimits, observe func(remote netip.Addr, outcome string)) (*AcceptLimiter, error) {
	if err := limits.Validate(); err != nil {
		return nil, err
	}
	if observe == nil {
		observe = func(netip.Addr, string) {}
	}
	return &AcceptLimiter{
		limits: limits, observe: observe,
		peers: map[netip.Prefix]*pendingPeer{}, withCount: make([]int, limits.PerPeer+1),
		byAddrs: map[connAddrs]*pendingConn{},
	}, nil
}

// Limits returns the limits in force.
func (l *AcceptLimiter) Limits() AcceptLimits { return l.limits }

// Count returns how often outcome (AcceptPeerBusy, AcceptBusy, AcceptDisplaced,
// AcceptTimeout) happened.
func (l *AcceptLimiter) Count(outcome string) int64 {
	for i, o := range acceptOutcomes {
		if o == outcome {
			return l.counts[i].Load()
		}
	}
	return 0
}

// Pending returns the connections accepted whose handshake has not finished.
func (l *AcceptLimiter) Pending() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pending
}

// Tracked returns the number of peers in the table (those with pending connections).
func (l *AcceptLimiter) Tracked() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.peers)
}

// Listener returns ln with its accepted connections bounded by l. Closing it closes ln and
// the connections accepted through it that are still pending.
func (l *AcceptLimiter) Listener(ln net.Listener) net.Listener {
	return &limitedListener{Listener: ln, l: l}
}

// Established ends the pending state of c, a connection from one of l's listeners, because
// its handshake finished; anything else (and a second call) is ignored.
func (l *AcceptLimiter) Established(c net.Conn) {
	if pc, ok := c.(*pendingConn); ok && pc.l == l {
		pc.established()
	}
}

// EstablishedAddrs is Established for the pending connection with these addresses.
func (l *AcceptLimiter) EstablishedAddrs(local, remote net.Addr) {
	if local == nil || remote == nil {
		return
	}
	l.mu.Lock()
	pc := l.byAddrs[connAddrs{local.String(), remote.String()}]
	l.mu.Unlock()
	if pc != nil {
		pc.established()
	}
}

func (l *AcceptLimiter) outcome(remote netip.Addr, outcome string) {
	for i, o := range acceptOutcomes {
		if o == outcome {
			l.counts[i].Add(1)
		}
	}
	l.observe(remote, outcome)
}

// admit decides on a freshly accepted connection: it returns the pending connection to hand
// to the server, or nil when c was refused (and closed).
func (l *AcceptLimiter) admit(c net.Conn, ln *limitedListener) net.Conn {
	addr := AddrOf(c.RemoteAddr())
	key := PeerKey(addr)
	l.mu.Lock()
	p := l.peers[key]
	held := 0
	if p != nil {
		held = p.count
	}
	if held >= l.limits.PerPeer {
		l.mu.Unlock()
		l.outcome(addr, AcceptPeerBusy)
		reset(c)
		return nil
	}
	var victim *pendingConn
	if l.pending >= l.limits.Total {
		if victim = l.victim(held); victim == nil {
			l.mu.Unlock()
			l.outcome(addr, AcceptBusy)
			reset(c)
			return nil
		}
		l.release(victim)
	}
	if p == nil {
		p = &pendingPeer{}
		l.peers[key] = p
	}
	pc := &pendingConn{Conn: c, l: l, ln: ln, peer: p, key: key, addr: addr}
	if c.LocalAddr() != nil && c.RemoteAddr() != nil {
		pc.addrs = connAddrs{c.LocalAddr().String(), c.RemoteAddr().String()}
	}
	l.add(pc)
	// The timer cannot fire before this returns: expire takes l.mu first.
	pc.timer = time.AfterFunc(l.limits.Timeout, pc.expire)
	l.mu.Unlock()
	if victim != nil {
		victim.timer.Stop()
		l.outcome(victim.addr, AcceptDisplaced)
		reset(victim.Conn)
	}
	return pc
}

// victim returns the oldest pending connection of a peer holding more than held, or nil.
// Called with l.mu held.
func (l *AcceptLimiter) victim(held int) *pendingConn {
	larger := false
	for c := held + 1; c < len(l.withCount); c++ {
		if l.withCount[c] > 0 {
			larger = true
			break
		}
	}
	if !larger {
		return nil
	}
	for pc := l.oldest; pc != nil; pc = pc.next {
		if pc.peer.count > held {
			return pc
		}
	}
	return nil
}

// add counts pc in. Called with l.mu held.
func (l *AcceptLimiter) add(pc *pendingConn) {
	l.recount(pc.peer, +1)
	l.pending++
	pc.prev = l.newest
	if l.newest != nil {
		l.newest.next = pc
	} else {
		l.oldest = pc
	}
	l.newest = pc
	if pc.addrs != (connAddrs{}) {
		l.byAddrs[pc.addrs] = pc
	}
}

// recount changes p's count by delta, keeping withCount. Called with l.mu held.
func (l *AcceptLimiter) recount(p *pendingPeer, delta int) {
	if p.count > 0 {
		l.withCount[p.count]--
	}
	p.count += delta
	if p.count > 0 {
		l.withCount[p.count]++
	}
}

// release counts pc out, once; it reports whether this call did. Called with l.mu held.
func (l *AcceptLimiter) release(pc *pendingConn) bool {
	if pc.released.Load() {
		return false
	}
	pc.released.Store(true)
	l.recount(pc.peer, -1)
	if pc.peer.count == 0 {
		delete(l.peers, pc.key)
	}
	l.pending--
	if pc.prev != nil {
		pc.prev.next = pc.next
	} else {
		l.oldest = pc.next
	}
	if pc.next != nil {
		pc.next.prev = pc.prev
	} else {
		l.newest = pc.prev
	}
	pc.prev, pc.next = nil, nil
	if l.byAddrs[pc.addrs] == pc {
		delete(l.byAddrs, pc.addrs)
	}
	return true
}

// closeListener closes the pending connections accepted through ln: a server that stops
// listening will not finish their handshakes.
func (l *AcceptLimiter) closeListener(ln *limitedListener) {
	var closing []*pendingConn
	l.mu.Lock()
	for pc := l.oldest; pc != nil; {
		next := pc.next
		if pc.ln == ln && l.release(pc) {
			closing = append(closing, pc)
		}
		pc = next
	}
	l.mu.Unlock()
	for _, pc := range closing {
		pc.timer.Stop()
		pc.Conn.Close()
	}
}

// reset closes c with a reset rather than an orderly shutdown: the connection is refused or
// abandoned, and a flood of them should leave no TIME_WAIT state behind on the server.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
}

type limitedListener struct {
	net.Listener
	l *AcceptLimiter
}

// Accept returns the next connection within the limits; refused ones are closed here and
// never returned.
func (ln *limitedListener) Accept() (net.Conn, error) {
	for {
		c, err := ln.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if pc := ln.l.admit(c, ln); pc != nil {
			return pc, nil
		}
	}
}

func (ln *limitedListener) Close() error {
	err := ln.Listener.Close()
	ln.l.closeListener(ln)
	return err
}

// pendingConn is an accepted connection; it is pending until established, expired or closed.
type pendingConn struct {
	net.Conn
	l     *AcceptLimiter
	ln    *limitedListener
	peer  *pendingPeer
	key   netip.Prefix
	addr  netip.Addr
	addrs connAddrs
	timer *time.Timer

	// released is set under l.mu; read without it for the fast path of established.
	released   atomic.Bool
	prev, next *pendingConn // guarded by l.mu
}

func (pc *pendingConn) established() {
	if pc.released.Load() {
		return
	}
	pc.l.mu.Lock()
	done := pc.l.release(pc)
	pc.l.mu.Unlock()
	if done {
		pc.timer.Stop()
	}
}

func (pc *pendingConn) expire() {
	pc.l.mu.Lock()
	done := pc.l.release(pc)
	pc.l.mu.Unlock()
	if done {
		pc.l.outcome(pc.addr, AcceptTimeout)
		reset(pc.Conn)
	}
}

// Close closes the connection and ends its pending state.
func (pc *pendingConn) Close() error {
	pc.established()
	return pc.Conn.Close()
}

// NetConn returns the accepted connection.
func (pc *pendingConn) NetConn() net.Conn { return pc.Conn }
