// Package apilb is the local provider's load balancer for the Kubernetes API: a TCP forwarder
// at one stable address of the cluster network, in front of every control plane whose API
// server passes a health check. It is what a cloud's network load balancer is to a cluster
// there: kubeadm's controlPlaneEndpoint, every kubeconfig of the cluster, the join tickets and
// the host's forward for the CLI name it, so no single control plane is the API's address.
//
// It forwards bytes only. TLS goes through it end to end: clients verify the API server's
// certificate (which carries the balancer's address), and the health check's HTTPS request
// checks nothing about the server it asks, on purpose: health is not trust. A balancer that
// lies (forwards to the wrong place, or drops everything) can deny service, as any network
// can, but sees and forges nothing (docs/threat-model.md).
//
// The provider tells the balancer which control planes exist (Update, from its own node list:
// created, rebooting, deleted); the balancer learns which of those serve from the health
// check (HTTPS GET /readyz answered 200, every HealthInterval per backend). A new connection
// goes to the next healthy backend in turn; a backend that refuses the connection is marked
// unhealthy at once and the next one is tried, so a client never lands on a dead server it
// could have been spared. A backend the provider is taking down is Draining: it gets no new
// connections, and keeps those it has, so a server shutting down gracefully finishes its
// requests and tells its HTTP/2 clients to go elsewhere (GOAWAY). A backend that leaves the
// list (powered off, deleted) has its connections closed.
package apilb

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"
)

// Defaults of Config.
const (
	// DefaultHealthInterval is how often each backend is asked: a server that stops answering
	// is out within this plus DefaultHealthTimeout, and a refused connection takes it out at
	// once.
	DefaultHealthInterval = 200 * time.Millisecond
	// DefaultHealthTimeout bounds one health check (connect, TLS, request, answer).
	DefaultHealthTimeout = time.Second
	// DefaultConnectTimeout bounds one connection attempt to a backend: the next backend is
	// tried after it.
	DefaultConnectTimeout = time.Second
	// DefaultDownAfter is how long a backend must fail its health checks before the balancer
	// closes the connections it has, when another backend serves (HAProxy's on-marked-down
	// shutdown-sessions): an API server whose etcd is gone answers nothing, and a client's
	// HTTP/2 connection, which carries all of its requests, would stay with it until the node
	// is off. A single failed check (a blip under load) closes nothing, nor does a down
	// backend that is the only one.
	DefaultDownAfter = 2 * time.Second
	// HealthPath is the API server's readiness endpoint, readable without credentials
	// (kubeadm's RBAC role system:public-info-viewer).
	HealthPath = "/readyz"
)

// DialFunc connects to a backend address (the provider dials from the cluster network).
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// Config configures a Balancer; zero values take the defaults.
type Config struct {
	Dial           DialFunc
	HealthInterval time.Duration
	HealthTimeout  time.Duration
	ConnectTimeout time.Duration
	// DownAfter defaults to DefaultDownAfter.
	DownAfter time.Duration
	Log       *slog.Logger
}

// Backend is an API server the balancer may forward to.
type Backend struct {
	// Addr is host:port of the API server.
	Addr string
	// Draining marks a backend that is going down: no new connections, those it has are kept.
	Draining bool
}

// Balancer forwards connections to healthy backends. It is safe for concurrent use.
type Balancer struct {
	cfg Config

	mu       sync.Mutex
	backends map[string]*backend
	order    []string // the backends' addresses, in the order Update listed them
	next     int      // round-robin position in order
	closed   bool
	wg       sync.WaitGroup // health checkers
	// Connections no backend accepted, logged at most once a second with their count: while
	// a cluster's first API server starts, its kubelet asks many times a second.
	refusedSince int
	refusedAt    time.Time
}

// backend is one API server with its health and its forwarded connections.
type backend struct {
	addr     string
	draining bool
	healthy  bool
	lastErr  string
	// failingSince is when the current run of failed checks began (zero while healthy);
	// down says its connections were closed for it.
	failingSince time.Time
	down         bool
	stop         context.CancelFunc
	conns        map[net.Conn]struct{} // both ends of every forwarded connection
}

// New returns a balancer without backends.
func New(cfg Config) *Balancer {
	if cfg.Dial == nil {
		cfg.Dial = (&net.Dialer{}).DialContext
	}
	if cfg.HealthInterval <= 0 {
		cfg.HealthInterval = DefaultHealthInterval
	}
	if cfg.HealthTimeout <= 0 {
		cfg.HealthTimeout = DefaultHealthTimeout
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = DefaultConnectTimeout
	}
	if cfg.DownAfter <= 0 {
		cfg.DownAfter = DefaultDownAfter
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Balancer{cfg: cfg, backends: map[string]*backend{}}
}

// Update sets the backends. A new backend starts unhealthy and is checked at once; one that
// stays keeps its health; one that left the list is no longer checked and its connections
// are closed (its server is gone: they would only hang).
func (b *Balancer) Update(backends []Backend) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	want := map[string]Backend{}
	b.order = b.order[:0]
	for _, be := range backends {
		if _, dup := want[be.Addr]; dup {
			continue
		}
		want[be.Addr] = be
		b.order = append(b.order, be.Addr)
	}
	for addr, be := range b.backends {
		if _, ok := want[addr]; !ok {
			b.dropLocked(be)
			delete(b.backends, addr)
		}
	}
	for addr, w := range want {
		be, ok := b.backends[addr]
		if !ok {
			ctx, stop := context.WithCancel(context.Background())
			be = &backend{addr: addr, stop: stop, conns: map[net.Conn]struct{}{}}
			b.backends[addr] = be
			b.wg.Add(1)
			go b.check(ctx, be)
		}
		if w.Draining && !be.draining {
			b.cfg.Log.Info("API backend draining: no new connections", "backend", addr, "connections", len(be.conns)/2)
		}
		be.draining = w.Draining
	}
}

// dropLocked stops checking be and closes its connections. Call with b.mu held.
func (b *Balancer) dropLocked(be *backend) {
	be.stop()
	for c := range be.conns {
		_ = c.Close()
	}
	b.cfg.Log.Info("API backend removed", "backend", be.addr, "connectionsClosed", len(be.conns)/2)
	be.conns = map[net.Conn]struct{}{}
}

// Status is a backend's state, for logs and tests.
type Status struct {
	Addr        string
	Healthy     bool
	Draining    bool
	Connections int
	LastError   string
}

// Status lists the backends in the order of the last Update.
func (b *Balancer) Status() []Status {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]Status, 0, len(b.order))
	for _, addr := range b.order {
		be := b.backends[addr]
		out = append(out, Status{Addr: addr, Healthy: be.healthy, Draining: be.draining, Connections: len(be.conns) / 2, LastError: be.lastErr})
	}
	return out
}

// Close stops every health check and closes every forwarded connection. Serve returns when
// its listener is closed, which is the caller's.
func (b *Balancer) Close() {
	b.mu.Lock()
	b.closed = true
	for _, be := range b.backends {
		b.dropLocked(be)
	}
	b.backends = map[string]*backend{}
	b.order = nil
	b.mu.Unlock()
	b.wg.Wait()
}

// Serve forwards the connections l accepts until l is closed. One balancer may serve several
// listeners (the cluster network's address and the host's loopback port).
func (b *Balancer) Serve(l net.Listener) error {
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("API load balancer: accepting: %w", err)
		}
		go b.forward(c)
	}
}

// candidates lists the backends a new connection may try, in order: the healthy ones from
// the round-robin position on, then the others that are not draining. The latter are a last
// resort for when no check passed (a cluster whose first API server is starting, or an etcd
// outage failing every readiness check): trying them costs only a refused connection, and
// the client's TLS still decides whom it talks to.
func (b *Balancer) candidates() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := len(b.order)
	var healthy, rest []string
	for i := range n {
		addr := b.order[(b.next+i)%n]
		be := b.backends[addr]
		switch {
		case be.draining:
		case be.healthy:
			healthy = append(healthy, addr)
		default:
			rest = append(rest, addr)
		}
	}
	if n > 0 {
		b.next = (b.next + 1) % n
	}
	return append(healthy, rest...)
}

// forward connects client to the first candidate that accepts, and copies both ways.
func (b *Balancer) forward(client net.Conn) {
	for _, addr := range b.candidates() {
		ctx, cancel := context.WithTimeout(context.Background(), b.cfg.ConnectTimeout)
		up, err := b.cfg.Dial(ctx, "tcp", addr)
		cancel()
		if err != nil {
			b.setHealth(addr, false, "connect: "+err.Error())
			continue
		}
		if !b.track(addr, client, up) {
			// The backend left the list while we dialed.
			_ = up.Close()
			continue
		}
		splice(client, up)
		b.untrack(addr, client, up)
		return
	}
	b.refused(client)
	_ = client.Close()
}

func (b *Balancer) refused(client net.Conn) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refusedSince++
	if time.Since(b.refusedAt) < time.Second {
		return
	}
	b.cfg.Log.Warn("API load balancer: no backend accepted the connection", "client", client.RemoteAddr().String(), "refusedSinceLastLog", b.refusedSince)
	b.refusedAt, b.refusedSince = time.Now(), 0
}

// splice copies both ways until either side ends, then closes both: an API server or client
// that ends its side is done with the connection.
func splice(a, b net.Conn) {
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(a, b); done <- struct{}{} }()
	go func() { _, _ = io.Copy(b, a); done <- struct{}{} }()
	<-done
	_ = a.Close()
	_ = b.Close()
	<-done
}

func (b *Balancer) track(addr string, conns ...net.Conn) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	be, ok := b.backends[addr]
	if !ok {
		return false
	}
	for _, c := range conns {
		be.conns[c] = struct{}{}
	}
	return true
}

func (b *Balancer) untrack(addr string, conns ...net.Conn) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if be, ok := b.backends[addr]; ok {
		for _, c := range conns {
			delete(be.conns, c)
		}
	}
}

// setHealth records a check's (or a connection attempt's) result; changes are logged.
func (b *Balancer) setHealth(addr string, healthy bool, why string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	be, ok := b.backends[addr]
	if !ok {
		return
	}
	if be.healthy != healthy {
		if healthy {
			b.cfg.Log.Info("API backend healthy", "backend", addr)
		} else {
			b.cfg.Log.Info("API backend unhealthy", "backend", addr, "why", why)
		}
	}
	be.healthy = healthy
	be.lastErr = why
	switch {
	case healthy:
		be.failingSince, be.down = time.Time{}, false
	case be.failingSince.IsZero():
		be.failingSince = time.Now()
	case !be.down && time.Since(be.failingSince) >= b.cfg.DownAfter && b.otherHealthyLocked(addr):
		// Down, and another backend serves: its clients are better off on a fresh
		// connection through the balancer. With no other, closing would only cut requests
		// (and watches) of a server that may be slow, not gone.
		be.down = true
		for c := range be.conns {
			_ = c.Close()
		}
		b.cfg.Log.Info("API backend down: its connections closed", "backend", addr, "failingFor", time.Since(be.failingSince).Round(time.Millisecond).String(), "connectionsClosed", len(be.conns)/2)
		be.conns = map[net.Conn]struct{}{}
	}
}

// otherHealthyLocked reports whether a backend other than addr is healthy and not draining.
// Call with b.mu held.
func (b *Balancer) otherHealthyLocked(addr string) bool {
	for a, be := range b.backends {
		if a != addr && be.healthy && !be.draining {
			return true
		}
	}
	return false
}

// check asks be's /readyz every HealthInterval until ctx ends.
func (b *Balancer) check(ctx context.Context, be *backend) {
	defer b.wg.Done()
	client := b.healthClient()
	defer client.CloseIdleConnections()
	for {
		err := b.checkOnce(ctx, client, be.addr)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			b.setHealth(be.addr, false, err.Error())
		} else {
			b.setHealth(be.addr, true, "")
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(b.cfg.HealthInterval):
		}
	}
}

// healthClient makes the health checks' HTTPS client: a fresh connection per check (a
// connection kept from an earlier check could outlive the server's reachability), and no
// certificate verification: the check decides where to try first, never whom to trust.
func (b *Balancer) healthClient() *http.Client {
	return &http.Client{
		Transport: &http.Transport{
			DialContext:       b.cfg.Dial,
			TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // health is not trust, see above
			DisableKeepAlives: true,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

func (b *Balancer) checkOnce(ctx context.Context, client *http.Client, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.HealthTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+HealthPath, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s answered %s", HealthPath, resp.Status)
	}
	return nil
}

// Healthy lists the addresses of the healthy backends that are not draining, sorted.
func (b *Balancer) Healthy() []string {
	var out []string
	for _, s := range b.Status() {
		if s.Healthy && !s.Draining {
			out = append(out, s.Addr)
		}
	}
	slices.Sort(out)
	return out
}
