package apilb_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/provider/local/apilb"
)

// fakeAPIServer is an HTTPS server on loopback that answers /readyz as told and every other
// path with its name, as an API server behind the balancer would.
type fakeAPIServer struct {
	name  string
	ready atomic.Bool
	srv   *httptest.Server
}

func newFakeAPIServer(t *testing.T, name string, ready bool) *fakeAPIServer {
	t.Helper()
	f := &fakeAPIServer{name: name}
	f.ready.Store(ready)
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == apilb.HealthPath {
			if !f.ready.Load() {
				http.Error(w, "not ready", http.StatusInternalServerError)
				return
			}
			_, _ = io.WriteString(w, "ok")
			return
		}
		_, _ = io.WriteString(w, name)
	}))
	f.srv.EnableHTTP2 = true
	f.srv.StartTLS()
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeAPIServer) addr() string { return f.srv.Listener.Addr().String() }

// deadAddr is a loopback address nothing listens on (a listener opened and closed).
func deadAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// startBalancer serves a balancer with fast health checks on a loopback port.
func startBalancer(t *testing.T) (*apilb.Balancer, string) {
	t.Helper()
	b := apilb.New(apilb.Config{HealthInterval: 20 * time.Millisecond, HealthTimeout: 500 * time.Millisecond, ConnectTimeout: 500 * time.Millisecond})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- b.Serve(l) }()
	t.Cleanup(func() {
		require.NoError(t, l.Close())
		require.NoError(t, <-served)
		b.Close()
	})
	return b, l.Addr().String()
}

// client reaches the balancer and verifies the servers' certificates (httptest's, issued
// for 127.0.0.1) end to end; one fresh connection per request unless keepAlive.
func client(t *testing.T, lbAddr string, keepAlive bool, servers ...*fakeAPIServer) *http.Client {
	t.Helper()
	pool := x509.NewCertPool()
	for _, s := range servers {
		pool.AddCert(s.srv.Certificate())
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, lbAddr)
		},
		TLSClientConfig:   &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"},
		DisableKeepAlives: !keepAlive,
		ForceAttemptHTTP2: true,
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 5 * time.Second}
}

func get(t *testing.T, c *http.Client) (string, error) {
	t.Helper()
	resp, err := c.Get("https://api.invalid/name")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return string(body), err
}

func waitHealthy(t *testing.T, b *apilb.Balancer, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return len(b.Healthy()) == n }, 10*time.Second, 10*time.Millisecond, "backends: %+v", b.Status())
}

func TestForwardsOnlyToHealthyBackends(t *testing.T) {
	testCases := map[string]struct {
		ready    []bool // one backend each
		dead     int    // backends nothing listens on
		draining []bool
		want     []string // names that answer, each at least once over the requests
	}{
		"every backend healthy: round robin":  {ready: []bool{true, true, true}, want: []string{"a0", "a1", "a2"}},
		"a not-ready backend is skipped":      {ready: []bool{true, false, true}, want: []string{"a0", "a2"}},
		"a dead backend is skipped":           {ready: []bool{true, true}, dead: 2, want: []string{"a0", "a1"}},
		"a draining backend gets nothing":     {ready: []bool{true, true}, draining: []bool{true, false}, want: []string{"a1"}},
		"none ready: the not-ready are tried": {ready: []bool{false, false}, dead: 1, want: []string{"a0", "a1"}},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			b, lbAddr := startBalancer(t)
			var servers []*fakeAPIServer
			var backends []apilb.Backend
			for i, r := range tc.ready {
				s := newFakeAPIServer(t, "a"+string(rune('0'+i)), r)
				servers = append(servers, s)
				be := apilb.Backend{Addr: s.addr()}
				if i < len(tc.draining) {
					be.Draining = tc.draining[i]
				}
				backends = append(backends, be)
			}
			for range tc.dead {
				backends = append(backends, apilb.Backend{Addr: deadAddr(t)})
			}
			b.Update(backends)
			healthy := 0
			for i, r := range tc.ready {
				if r && (i >= len(tc.draining) || !tc.draining[i]) {
					healthy++
				}
			}
			waitHealthy(t, b, healthy)
			c := client(t, lbAddr, false, servers...)
			seen := map[string]int{}
			for range 6 * len(backends) {
				name, err := get(t, c)
				require.NoError(t, err, "every request succeeds")
				seen[name]++
			}
			var got []string
			for n := range seen {
				got = append(got, n)
			}
			assert.ElementsMatch(t, tc.want, got, "backends that answered: %v", seen)
		})
	}
}

// A backend that stops answering its readiness check is out within a few check intervals,
// and back once it answers again; requests meanwhile all succeed elsewhere.
func TestFailoverAndBack(t *testing.T) {
	b, lbAddr := startBalancer(t)
	s0, s1 := newFakeAPIServer(t, "s0", true), newFakeAPIServer(t, "s1", true)
	b.Update([]apilb.Backend{{Addr: s0.addr()}, {Addr: s1.addr()}})
	waitHealthy(t, b, 2)
	c := client(t, lbAddr, false, s0, s1)

	s0.ready.Store(false)
	require.Eventually(t, func() bool { return assert.ObjectsAreEqual([]string{s1.addr()}, b.Healthy()) }, 5*time.Second, 5*time.Millisecond)
	for range 10 {
		name, err := get(t, c)
		require.NoError(t, err)
		assert.Equal(t, "s1", name)
	}
	s0.ready.Store(true)
	waitHealthy(t, b, 2)
}

// A refused connection takes the backend out at once and the client's connection goes to the
// next one, before any health check noticed.
func TestRefusedConnectionTriesTheNext(t *testing.T) {
	b := apilb.New(apilb.Config{HealthInterval: time.Hour})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = b.Serve(l) }()
	t.Cleanup(func() { l.Close(); b.Close() })
	s0, s1 := newFakeAPIServer(t, "s0", true), newFakeAPIServer(t, "s1", true)
	b.Update([]apilb.Backend{{Addr: s0.addr()}, {Addr: s1.addr()}})
	waitHealthy(t, b, 2) // the first checks run at once
	s0.srv.Close()       // down between two checks (the next is an hour away)
	c := client(t, l.Addr().String(), false, s0, s1)
	for range 4 {
		name, err := get(t, c)
		require.NoError(t, err, "no request lands on the closed server")
		assert.Equal(t, "s1", name)
	}
	assert.Equal(t, []string{s1.addr()}, b.Healthy())
}

// Draining keeps a backend's connections (its server finishes them); removing the backend
// closes them.
func TestDrainKeepsConnectionsRemoveClosesThem(t *testing.T) {
	b, lbAddr := startBalancer(t)
	s0 := newFakeAPIServer(t, "s0", true)
	s1 := newFakeAPIServer(t, "s1", true)
	b.Update([]apilb.Backend{{Addr: s0.addr()}})
	waitHealthy(t, b, 1)
	c := client(t, lbAddr, true, s0, s1) // one kept HTTP/2 connection
	name, err := get(t, c)
	require.NoError(t, err)
	require.Equal(t, "s0", name)

	b.Update([]apilb.Backend{{Addr: s0.addr(), Draining: true}, {Addr: s1.addr()}})
	waitHealthy(t, b, 1)
	name, err = get(t, c)
	require.NoError(t, err, "the kept connection still works while its backend drains")
	assert.Equal(t, "s0", name)
	assert.Equal(t, 1, b.Status()[0].Connections)

	fresh := client(t, lbAddr, false, s0, s1)
	name, err = get(t, fresh)
	require.NoError(t, err)
	assert.Equal(t, "s1", name, "new connections avoid the draining backend")

	b.Update([]apilb.Backend{{Addr: s1.addr()}})
	require.Eventually(t, func() bool {
		name, err := get(t, c)
		return err == nil && name == "s1"
	}, 5*time.Second, 10*time.Millisecond, "the removed backend's connection was closed; the client reconnected to s1")
}

// Many clients at once while backends flap: no request fails as long as one backend serves.
func TestConcurrentClientsWhileBackendsFlap(t *testing.T) {
	b, lbAddr := startBalancer(t)
	s := []*fakeAPIServer{newFakeAPIServer(t, "s0", true), newFakeAPIServer(t, "s1", true), newFakeAPIServer(t, "s2", true)}
	b.Update([]apilb.Backend{{Addr: s[0].addr()}, {Addr: s[1].addr()}, {Addr: s[2].addr()}})
	waitHealthy(t, b, 3)
	c := client(t, lbAddr, false, s...)
	var wg sync.WaitGroup
	var failures atomic.Int32
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for range 8 {
		wg.Go(func() {
			for ctx.Err() == nil {
				if _, err := get(t, c); err != nil {
					failures.Add(1)
				}
			}
		})
	}
	// Backends 0 and 1 take turns being unready (a rolling restart); 2 stays.
	for i := 0; ctx.Err() == nil; i++ {
		b.Update([]apilb.Backend{{Addr: s[0].addr(), Draining: i%2 == 0}, {Addr: s[1].addr(), Draining: i%2 == 1}, {Addr: s[2].addr()}})
		time.Sleep(50 * time.Millisecond)
	}
	wg.Wait()
	assert.Zero(t, failures.Load())
}

// BenchmarkFailover measures, with the default health check (every 200 ms), how long a backend
// whose /readyz starts failing keeps getting new connections (out-ms), and how long a
// recovered one waits to get them again (back-ms). A refused connection takes a backend out
// at once; this is the slower case of a server that still accepts but is not ready.
func BenchmarkFailover(b *testing.B) {
	lb := apilb.New(apilb.Config{})
	defer lb.Close()
	var srv [2]*fakeAPIServer
	for i := range srv {
		srv[i] = &fakeAPIServer{name: "s"}
		srv[i].ready.Store(true)
		srv[i].srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			if !srv[i].ready.Load() {
				w.WriteHeader(http.StatusServiceUnavailable)
			}
		}))
		defer srv[i].srv.Close()
	}
	lb.Update([]apilb.Backend{{Addr: srv[0].addr()}, {Addr: srv[1].addr()}})
	until := func(n int) time.Duration {
		start := time.Now()
		for len(lb.Healthy()) != n {
			time.Sleep(time.Millisecond)
		}
		return time.Since(start)
	}
	until(2)
	var out, back time.Duration
	b.ResetTimer()
	for b.Loop() {
		srv[0].ready.Store(false)
		out += until(1)
		srv[0].ready.Store(true)
		back += until(2)
	}
	b.ReportMetric(float64(out.Milliseconds())/float64(b.N), "out-ms")
	b.ReportMetric(float64(back.Milliseconds())/float64(b.N), "back-ms")
}

// A backend that fails its checks for DownAfter loses its connections (its API server is
// gone for its clients, whose kept connection would stay with it); one failed check among
// good ones closes nothing.
func TestDownBackendLosesItsConnections(t *testing.T) {
	b := apilb.New(apilb.Config{HealthInterval: 20 * time.Millisecond, HealthTimeout: 500 * time.Millisecond, ConnectTimeout: 500 * time.Millisecond, DownAfter: 300 * time.Millisecond})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- b.Serve(l) }()
	t.Cleanup(func() {
		require.NoError(t, l.Close())
		require.NoError(t, <-served)
		b.Close()
	})
	s0 := newFakeAPIServer(t, "s0", true)
	s1 := newFakeAPIServer(t, "s1", true)
	b.Update([]apilb.Backend{{Addr: s0.addr()}})
	waitHealthy(t, b, 1)
	c := client(t, l.Addr().String(), true, s0, s1) // one kept HTTP/2 connection
	name, err := get(t, c)
	require.NoError(t, err)
	require.Equal(t, "s0", name)
	b.Update([]apilb.Backend{{Addr: s0.addr()}, {Addr: s1.addr()}})
	waitHealthy(t, b, 2)

	// s0 keeps serving its clients but fails its checks: down after DownAfter.
	s0.ready.Store(false)
	require.Eventually(t, func() bool {
		name, err := get(t, c)
		return err == nil && name == "s1"
	}, 5*time.Second, 10*time.Millisecond, "the down backend's connection was closed; the client reconnected to s1")
	assert.Zero(t, b.Status()[0].Connections)

	// Back up: it serves new connections again and nothing is closed while it is healthy.
	s0.ready.Store(true)
	waitHealthy(t, b, 2)

	// The only backend failing its checks keeps its connections: there is nowhere else to go.
	b.Update([]apilb.Backend{{Addr: s1.addr()}})
	waitHealthy(t, b, 1)
	name, err = get(t, c)
	require.NoError(t, err)
	require.Equal(t, "s1", name)
	s1.ready.Store(false)
	require.Eventually(t, func() bool { return len(b.Healthy()) == 0 }, 5*time.Second, 10*time.Millisecond)
	time.Sleep(3 * 300 * time.Millisecond) // well past DownAfter
	assert.Equal(t, 1, b.Status()[0].Connections, "the only backend's connection is kept")
	name, err = get(t, c)
	require.NoError(t, err, "and still serves its client")
	assert.Equal(t, "s1", name)
}
