package collateral

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/pkg/api/attestation/hardwarepb"
)

// fakeFetcher serves fixed documents and counts fetches; fail makes it fail.
type fakeFetcher struct {
	mu    sync.Mutex
	docs  map[string][]byte
	fail  error
	count atomic.Int32
	gate  chan struct{}
}

func (f *fakeFetcher) Fetch(_ context.Context, url string) (map[string][]string, []byte, error) {
	f.count.Add(1)
	if f.gate != nil {
		<-f.gate
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return nil, nil, f.fail
	}
	body, ok := f.docs[url]
	if !ok {
		return nil, nil, errors.New("HTTP 404 Not Found")
	}
	return map[string][]string{"X-Test": {url}}, body, nil
}

// testCRL returns a DER CRL with the given next update.
func testCRL(t *testing.T, next time.Time) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ca"}, NotBefore: next.Add(-48 * time.Hour), NotAfter: next.Add(48 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCRLSign | x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	// Issued a day before its next update: a later next update means a later issue.
	crl, err := x509.CreateRevocationList(rand.Reader, &x509.RevocationList{Number: big.NewInt(1), ThisUpdate: next.Add(-24 * time.Hour), NextUpdate: next}, ca, key)
	require.NoError(t, err)
	return crl
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time                 { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration)            { c.mu.Lock(); defer c.mu.Unlock(); c.t = c.t.Add(d) }
func newClock() *clock                          { return &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }
func ctx(t *testing.T) context.Context          { return t.Context() }
func (f *fakeFetcher) set(url string, b []byte) { f.mu.Lock(); f.docs[url] = b; f.mu.Unlock() }

func TestCRLCachedUntilNextUpdateThenFailsClosed(t *testing.T) {
	clk := newClock()
	f := &fakeFetcher{docs: map[string][]byte{}}
	f.set("https://kds/crl", testCRL(t, clk.Now().Add(7*24*time.Hour)))
	c := New(Config{Fetcher: f, Now: clk.Now})

	doc, err := c.Get(ctx(t), "https://kds/crl")
	require.NoError(t, err)
	assert.Equal(t, clk.Now().Add(7*24*time.Hour), doc.NextUpdate.UTC())
	_, err = c.Get(ctx(t), "https://kds/crl")
	require.NoError(t, err)
	assert.EqualValues(t, 1, f.count.Load(), "a fresh CRL is served from the cache")

	// Past its next update: fetched again; the server still has the old CRL, which is
	// stale, so the lookup fails rather than use it.
	clk.Add(7*24*time.Hour + time.Second)
	_, err = c.Get(ctx(t), "https://kds/crl")
	assert.ErrorIs(t, err, ErrStale)
	assert.EqualValues(t, 2, f.count.Load())

	// The network fails: still closed.
	f.mu.Lock()
	f.fail = errors.New("connection refused")
	f.mu.Unlock()
	_, err = c.Get(ctx(t), "https://kds/crl")
	assert.ErrorContains(t, err, "connection refused")

	// A new CRL is published: used.
	f.mu.Lock()
	f.fail = nil
	f.mu.Unlock()
	f.set("https://kds/crl", testCRL(t, clk.Now().Add(24*time.Hour)))
	_, err = c.Get(ctx(t), "https://kds/crl")
	require.NoError(t, err)
}

func TestStaleEntryWithFailingFetchIsErrStale(t *testing.T) {
	clk := newClock()
	f := &fakeFetcher{docs: map[string][]byte{"https://x/crl": testCRL(t, clk.Now().Add(time.Hour))}}
	c := New(Config{Fetcher: f, Now: clk.Now})
	_, err := c.Get(ctx(t), "https://x/crl")
	require.NoError(t, err)
	clk.Add(2 * time.Hour)
	f.mu.Lock()
	f.fail = errors.New("timeout")
	f.mu.Unlock()
	_, err = c.Get(ctx(t), "https://x/crl")
	assert.ErrorIs(t, err, ErrStale)
}

func TestOffline(t *testing.T) {
	clk := newClock()
	c := New(Config{Now: clk.Now})
	_, err := c.Get(ctx(t), "https://kds/vcek")
	assert.ErrorIs(t, err, ErrOffline)

	require.NoError(t, c.Put("https://kds/crl", nil, testCRL(t, clk.Now().Add(time.Hour))))
	_, err = c.Get(ctx(t), "https://kds/crl")
	require.NoError(t, err)
	clk.Add(time.Hour)
	_, err = c.Get(ctx(t), "https://kds/crl")
	assert.ErrorIs(t, err, ErrStale)

	assert.ErrorIs(t, c.Put("https://kds/old", nil, testCRL(t, clk.Now().Add(-time.Minute))), ErrStale)
}

func TestUnknownDocumentsKeptForMaxAge(t *testing.T) {
	clk := newClock()
	f := &fakeFetcher{docs: map[string][]byte{"https://x/blob": []byte("opaque")}}
	c := New(Config{Fetcher: f, Now: clk.Now, MaxAge: time.Hour})
	doc, err := c.Get(ctx(t), "https://x/blob")
	require.NoError(t, err)
	assert.Equal(t, []string{"https://x/blob"}, doc.Header["X-Test"])
	clk.Add(59 * time.Minute)
	_, err = c.Get(ctx(t), "https://x/blob")
	require.NoError(t, err)
	assert.EqualValues(t, 1, f.count.Load())
	clk.Add(2 * time.Minute)
	_, err = c.Get(ctx(t), "https://x/blob")
	require.NoError(t, err)
	assert.EqualValues(t, 2, f.count.Load())
}

func TestIntelJSONNextUpdate(t *testing.T) {
	fallback := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for name, tc := range map[string]struct {
		body string
		want time.Time
	}{
		"tcb info":         {`{"tcbInfo":{"nextUpdate":"2026-02-01T00:00:00Z"},"signature":"00"}`, time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)},
		"enclave identity": {`{"enclaveIdentity":{"nextUpdate":"2026-03-01T00:00:00Z"}}`, time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)},
		"no next update":   {`{"other":1}`, fallback},
		"not json":         {`{`, fallback},
	} {
		assert.Equal(t, tc.want, NextUpdate([]byte(tc.body), fallback).UTC(), name)
	}
}

func TestSessionCarriedDocumentsStayPrivate(t *testing.T) {
	clk := newClock()
	c := New(Config{Now: clk.Now})
	carried := []*hardwarepb.Collateral{
		{Url: "https://kds/crl", Body: testCRL(t, clk.Now().Add(time.Hour))},
		{Url: "https://kds/stale", Body: testCRL(t, clk.Now().Add(-time.Hour))},
	}
	s := c.Session(ctx(t), carried)
	body, err := SNPGetter{s}.Get("https://kds/crl")
	require.NoError(t, err)
	assert.Equal(t, carried[0].Body, body)
	_, err = SNPGetter{s}.Get("https://kds/stale")
	assert.ErrorIs(t, err, ErrOffline, "a stale carried document is ignored")

	// Another validation does not see what the first evidence carried.
	_, _, err = TDXGetter{c.Session(ctx(t), nil)}.Get("https://kds/crl")
	assert.ErrorIs(t, err, ErrOffline)
}

func TestConcurrentGetsFetchOnce(t *testing.T) {
	clk := newClock()
	f := &fakeFetcher{docs: map[string][]byte{"https://x/crl": testCRL(t, clk.Now().Add(time.Hour))}, gate: make(chan struct{})}
	c := New(Config{Fetcher: f, Now: clk.Now})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			_, err := c.Get(ctx(t), "https://x/crl")
			errs <- err
		})
	}
	// Let the one fetch finish once every caller is waiting on it or served.
	require.Eventually(t, func() bool { return f.count.Load() >= 1 }, 5*time.Second, time.Millisecond)
	close(f.gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	assert.EqualValues(t, 1, f.count.Load(), "callers share one fetch, later ones the cached document")
	_, err := c.Get(ctx(t), "https://x/crl")
	require.NoError(t, err)
}

func TestEvictsOldestWhenFull(t *testing.T) {
	clk := newClock()
	c := New(Config{Now: clk.Now, MaxEntries: 2})
	for _, u := range []string{"a", "b", "c"} {
		require.NoError(t, c.Put(u, nil, []byte(u)))
		clk.Add(time.Second)
	}
	_, err := c.Get(ctx(t), "a")
	assert.ErrorIs(t, err, ErrOffline)
	for _, u := range []string{"b", "c"} {
		_, err := c.Get(ctx(t), u)
		assert.NoError(t, err, u)
	}
}

func TestTooLarge(t *testing.T) {
	c := New(Config{})
	assert.ErrorContains(t, c.Put("x", nil, make([]byte, MaxDocumentSize+1)), "limit")
}

// TestCarriedCRLNeverRollsBack: evidence carrying an older CRL (from before a revocation,
// still within its validity) must not displace the newer one the cache holds or can fetch.
func TestCarriedCRLNeverRollsBack(t *testing.T) {
	clk := newClock()
	older := testCRL(t, clk.Now().Add(time.Hour))
	newer := testCRL(t, clk.Now().Add(2*time.Hour))
	f := &fakeFetcher{docs: map[string][]byte{"https://kds/crl": newer}}
	online := New(Config{Fetcher: f, Now: clk.Now})
	body, err := SNPGetter{online.Session(ctx(t), []*hardwarepb.Collateral{{Url: "https://kds/crl", Body: older}})}.Get("https://kds/crl")
	require.NoError(t, err)
	assert.Equal(t, newer, body, "online: the fetched CRL wins")

	offline := New(Config{Now: clk.Now})
	require.NoError(t, offline.Put("https://kds/crl", nil, newer))
	body, err = SNPGetter{offline.Session(ctx(t), []*hardwarepb.Collateral{{Url: "https://kds/crl", Body: older}})}.Get("https://kds/crl")
	require.NoError(t, err)
	assert.Equal(t, newer, body, "offline: the newer cached CRL wins")

	// A newer carried CRL is used, and a carried one when nothing else is available.
	f.set("https://kds/crl", older)
	online2 := New(Config{Fetcher: f, Now: clk.Now})
	body, err = SNPGetter{online2.Session(ctx(t), []*hardwarepb.Collateral{{Url: "https://kds/crl", Body: newer}})}.Get("https://kds/crl")
	require.NoError(t, err)
	assert.Equal(t, newer, body)
	f.mu.Lock()
	f.fail = errors.New("no network")
	f.mu.Unlock()
	online3 := New(Config{Fetcher: f, Now: clk.Now})
	body, err = SNPGetter{online3.Session(ctx(t), []*hardwarepb.Collateral{{Url: "https://kds/crl", Body: older}})}.Get("https://kds/crl")
	require.NoError(t, err)
	assert.Equal(t, older, body)
}
