// Package collateral caches the documents hardware evidence is checked with: AMD's VCEK
// certificates and CRLs, Intel's PCK CRLs, TCB info and QE identity. One cache, keyed by URL,
// serves both the SEV-SNP and the TDX validators through the getter interfaces of go-sev-guest
// and go-tdx-guest.
//
// Freshness is the point. Each document is kept with the time it was fetched and the time
// after which it must not be used (its next update): a CRL's nextUpdate, the nextUpdate of
// Intel's signed JSON, the earliest notAfter of certificates, else Config.MaxAge after the
// fetch. A document
// past that time is fetched again; if that fails, the lookup fails (fail closed): a verifier
// that kept using a stale CRL would never learn of a revocation.
//
// The next update is read from the document before its signature is checked. That is safe:
// it only decides how long the cache keeps a document; the libraries verify every document's
// signature and validity window each time they use it.
//
// Evidence may carry its own collateral (Session), so that `constellation verify` works
// without network. Carried documents are used for one validation only and never enter the
// shared cache: one peer's evidence cannot change what another peer's is checked with.
package collateral

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/openconstellation/constellation/pkg/api/attestation/hardwarepb"
	"github.com/openconstellation/constellation/pkg/strictjson"
)

// ErrOffline: the document is neither cached nor carried, and the cache has no fetcher.
var ErrOffline = errors.New("collateral not available offline")

// ErrStale: the document is past its next update and could not be fetched again.
var ErrStale = errors.New("collateral past its next update")

// Defaults.
const (
	// DefaultMaxAge bounds how long a document without a next update of its own is kept.
	DefaultMaxAge = 24 * time.Hour
	// DefaultMaxEntries bounds the cache: VCEKs are per chip and TCB, so a large fleet has
	// many; beyond the bound the oldest fetch is evicted.
	DefaultMaxEntries = 4096
	// MaxDocumentSize bounds one document (CRLs of Intel's PCS are the largest, ~100 KiB).
	MaxDocumentSize = 4 << 20
	// FetchTimeout bounds one fetch when the caller's context has no deadline.
	FetchTimeout = 20 * time.Second
)

// Document is one cached document.
type Document struct {
	URL    string
	Header map[string][]string
	Body   []byte
	// Fetched is when the document was fetched (or carried in).
	Fetched time.Time
	// NextUpdate is when the document must no longer be used.
	NextUpdate time.Time
	// Issued is when the document was issued (a CRL's thisUpdate, the issueDate of Intel's
	// signed JSON), or zero if it does not say.
	Issued time.Time
	// Immutable is set for certificates: what a URL serves never changes until it expires,
	// so a copy from anywhere is as good as a fetch. CRLs and signed TCB documents change
	// (a newer one may revoke), so where they come from matters (Session.Get).
	Immutable bool
}

// Fetcher fetches a document. Real verifiers use NewHTTPFetcher; tests use fakes.
type Fetcher interface {
	Fetch(ctx context.Context, url string) (header map[string][]string, body []byte, err error)
}

// Config configures a Cache.
type Config struct {
	// Fetcher fetches missing and stale documents; nil makes the cache offline (only
	// documents carried by evidence or Put can be used).
	Fetcher Fetcher
	// Now defaults to time.Now.
	Now func() time.Time
	// MaxAge defaults to DefaultMaxAge.
	MaxAge time.Duration
	// MaxEntries defaults to DefaultMaxEntries.
	MaxEntries int
}

// Cache is a concurrency-safe cache of collateral documents keyed by URL.
type Cache struct {
	cfg Config

	mu      sync.Mutex
	entries map[string]Document
	// fetches deduplicates concurrent fetches of one URL.
	fetches map[string]*fetch
}

type fetch struct {
	done chan struct{}
	doc  Document
	err  error
}

// New returns an empty cache.
func New(cfg Config) *Cache {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MaxAge <= 0 {
		cfg.MaxAge = DefaultMaxAge
	}
	if cfg.MaxEntries <= 0 {
		cfg.MaxEntries = DefaultMaxEntries
	}
	return &Cache{cfg: cfg, entries: map[string]Document{}, fetches: map[string]*fetch{}}
}

// Now returns the cache's time: validators check documents at the same instant.
func (c *Cache) Now() time.Time { return c.cfg.Now() }

// Put adds a document (for example one shipped with a release), computing its next update.
// A document already past its next update is refused.
func (c *Cache) Put(url string, header map[string][]string, body []byte) error {
	doc, err := c.document(url, header, body)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.store(doc)
	return nil
}

// document builds a fresh document, or fails if it is already stale.
func (c *Cache) document(url string, header map[string][]string, body []byte) (Document, error) {
	if len(body) > MaxDocumentSize {
		return Document{}, fmt.Errorf("collateral %s: %d bytes, limit %d", url, len(body), MaxDocumentSize)
	}
	now := c.cfg.Now()
	doc := Document{URL: url, Header: header, Body: body, Fetched: now}
	var ok bool
	if doc.Issued, doc.NextUpdate, doc.Immutable, ok = dates(body); !ok {
		doc.NextUpdate = now.Add(c.cfg.MaxAge)
	}
	if !now.Before(doc.NextUpdate) {
		return Document{}, fmt.Errorf("%w: %s: next update was %s", ErrStale, url, doc.NextUpdate.UTC().Format(time.RFC3339))
	}
	return doc, nil
}

// store adds doc, evicting the oldest fetch when full. c.mu is held.
func (c *Cache) store(doc Document) {
	if _, ok := c.entries[doc.URL]; !ok && len(c.entries) >= c.cfg.MaxEntries {
		var oldest string
		for url, d := range c.entries {
			if oldest == "" || d.Fetched.Before(c.entries[oldest].Fetched) {
				oldest = url
			}
		}
		delete(c.entries, oldest)
	}
	c.entries[doc.URL] = doc
}

// Get returns a fresh document for url: cached, or fetched (once, however many callers ask
// at the same time). A document past its next update is never returned.
func (c *Cache) Get(ctx context.Context, url string) (Document, error) {
	c.mu.Lock()
	if doc, ok := c.entries[url]; ok && c.cfg.Now().Before(doc.NextUpdate) {
		c.mu.Unlock()
		return doc, nil
	}
	stale := false
	if _, ok := c.entries[url]; ok {
		stale = true
		delete(c.entries, url)
	}
	if c.cfg.Fetcher == nil {
		c.mu.Unlock()
		if stale {
			return Document{}, fmt.Errorf("%w: %s, and the cache is offline", ErrStale, url)
		}
		return Document{}, fmt.Errorf("%w: %s", ErrOffline, url)
	}
	f, inFlight := c.fetches[url]
	if !inFlight {
		f = &fetch{done: make(chan struct{})}
		c.fetches[url] = f
	}
	c.mu.Unlock()

	if !inFlight {
		f.doc, f.err = c.fetch(ctx, url, stale)
		c.mu.Lock()
		if f.err == nil {
			c.store(f.doc)
		}
		delete(c.fetches, url)
		c.mu.Unlock()
		close(f.done)
	}
	select {
	case <-f.done:
		return f.doc, f.err
	case <-ctx.Done():
		return Document{}, fmt.Errorf("collateral %s: %w", url, ctx.Err())
	}
}

func (c *Cache) fetch(ctx context.Context, url string, stale bool) (Document, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, FetchTimeout)
		defer cancel()
	}
	header, body, err := c.cfg.Fetcher.Fetch(ctx, url)
	if err != nil {
		if stale {
			return Document{}, fmt.Errorf("%w: %s: fetching it again: %w", ErrStale, url, err)
		}
		return Document{}, fmt.Errorf("fetching collateral %s: %w", url, err)
	}
	return c.document(url, header, body)
}

// Session is the view of one validation: documents the evidence carried first (when still
// fresh), then the shared cache. It implements the getter interfaces of go-sev-guest
// (SNPGetter) and go-tdx-guest (TDXGetter).
type Session struct {
	ctx     context.Context
	cache   *Cache
	carried map[string]Document
}

// Session returns a session for one validation with the documents carried by the evidence.
// Carried documents that are malformed or stale are ignored (the shared cache or the
// network is asked instead); at most MaxCarried are considered.
func (c *Cache) Session(ctx context.Context, carried []*hardwarepb.Collateral) *Session {
	s := &Session{ctx: ctx, cache: c, carried: map[string]Document{}}
	for i, d := range carried {
		if i >= MaxCarried {
			break
		}
		header := map[string][]string{}
		for k, v := range d.GetHeaders() {
			header[k] = []string{v}
		}
		doc, err := c.document(d.GetUrl(), header, d.GetBody())
		if err != nil {
			continue
		}
		s.carried[doc.URL] = doc
	}
	return s
}

// MaxCarried bounds the documents one evidence may carry.
const MaxCarried = 16

// Get returns the document for url.
//
// A certificate the evidence carried is used as it is. A document that changes over time (a
// CRL, signed TCB info) is taken from the shared cache, or fetched, first: evidence could
// carry an old CRL, still within its validity, from before a revocation. The carried copy is
// used only when the cache has none and cannot fetch one (a verifier without network), or
// when it was issued after the cached one.
func (s *Session) Get(url string) (Document, error) {
	carried, ok := s.carried[url]
	if ok && carried.Immutable {
		return carried, nil
	}
	doc, err := s.cache.Get(s.ctx, url)
	switch {
	case !ok:
		return doc, err
	case err != nil:
		return carried, nil
	case carried.Issued.After(doc.Issued):
		return carried, nil
	default:
		return doc, nil
	}
}

// Carried returns the documents this session used from the evidence, for diagnostics.
func (s *Session) Carried() int { return len(s.carried) }

// SNPGetter adapts a session to go-sev-guest's trust.HTTPSGetter and ContextHTTPSGetter.
type SNPGetter struct{ S *Session }

// Get implements trust.HTTPSGetter.
func (g SNPGetter) Get(url string) ([]byte, error) {
	doc, err := g.S.Get(url)
	return doc.Body, err
}

// GetContext implements trust.ContextHTTPSGetter. The session's context bounds fetches.
func (g SNPGetter) GetContext(_ context.Context, url string) ([]byte, error) { return g.Get(url) }

// TDXGetter adapts a session to go-tdx-guest's trust.HTTPSGetter and ContextHTTPSGetter.
type TDXGetter struct{ S *Session }

// Get implements trust.HTTPSGetter.
func (g TDXGetter) Get(url string) (map[string][]string, []byte, error) {
	doc, err := g.S.Get(url)
	return doc.Header, doc.Body, err
}

// GetContext implements trust.ContextHTTPSGetter.
func (g TDXGetter) GetContext(_ context.Context, url string) (map[string][]string, []byte, error) {
	return g.Get(url)
}

// NextUpdate returns when body must no longer be used: the nextUpdate of a CRL (DER or
// PEM) or of Intel's signed JSON (tcbInfo, enclaveIdentity), the earliest notAfter of
// certificates (DER or PEM), or fallback for anything else.
func NextUpdate(body []byte, fallback time.Time) time.Time {
	if _, next, _, ok := dates(body); ok {
		return next
	}
	return fallback
}

// dates reads, parsing body once, what a document says of its own freshness: when it was
// issued (zero if it does not say), when it must no longer be used, and whether it is a
// certificate, which never changes at its URL (AMD's VCEK URLs name the chip and TCB) and is
// kept until it expires. ok is false for a document that says nothing of either.
func dates(body []byte) (issued, next time.Time, immutable, ok bool) {
	if crl := parseCRL(body); crl != nil && !crl.NextUpdate.IsZero() {
		return crl.ThisUpdate, crl.NextUpdate, false, true
	}
	if issued, next, ok := intelDates(body); ok {
		return issued, next, false, true
	}
	if notAfter, ok := certsNotAfter(body); ok {
		return time.Time{}, notAfter, true, true
	}
	return time.Time{}, time.Time{}, false, false
}

// parseCRL parses a DER or PEM CRL, or returns nil.
func parseCRL(body []byte) *x509.RevocationList {
	der := body
	if block, _ := pem.Decode(body); block != nil && block.Type == "X509 CRL" {
		der = block.Bytes
	}
	crl, err := x509.ParseRevocationList(der)
	if err != nil {
		return nil
	}
	return crl
}

// intelDates reads issueDate and nextUpdate of Intel's signed JSON (TCB info, QE identity).
func intelDates(body []byte) (issued, next time.Time, ok bool) {
	body = bytes.TrimSpace(body)
	if len(body) == 0 || body[0] != '{' {
		return time.Time{}, time.Time{}, false
	}
	type section struct {
		IssueDate  time.Time `json:"issueDate"`
		NextUpdate time.Time `json:"nextUpdate"`
	}
	var doc struct {
		TCBInfo         section `json:"tcbInfo"`
		EnclaveIdentity section `json:"enclaveIdentity"`
	}
	// Intel's documents have many more fields (and may gain some): only these are read.
	if strictjson.UnmarshalIgnoreUnknown(body, &doc) != nil {
		return time.Time{}, time.Time{}, false
	}
	for _, sec := range []section{doc.TCBInfo, doc.EnclaveIdentity} {
		if !sec.NextUpdate.IsZero() {
			return sec.IssueDate, sec.NextUpdate, true
		}
	}
	return time.Time{}, time.Time{}, false
}

func certsNotAfter(body []byte) (time.Time, bool) {
	var certs []*x509.Certificate
	if c, err := x509.ParseCertificates(body); err == nil {
		certs = c
	} else {
		rest := body
		for {
			var block *pem.Block
			block, rest = pem.Decode(rest)
			if block == nil {
				break
			}
			if c, err := x509.ParseCertificate(block.Bytes); err == nil {
				certs = append(certs, c)
			}
		}
	}
	if len(certs) == 0 {
		return time.Time{}, false
	}
	earliest := certs[0].NotAfter
	for _, c := range certs[1:] {
		if c.NotAfter.Before(earliest) {
			earliest = c.NotAfter
		}
	}
	return earliest, true
}

// HTTPFetcher fetches documents over HTTPS with a size limit.
type HTTPFetcher struct {
	Client *http.Client
}

// NewHTTPFetcher returns a fetcher on client (http.DefaultClient if nil).
func NewHTTPFetcher(client *http.Client) *HTTPFetcher {
	if client == nil {
		client = http.DefaultClient
	}
	return &HTTPFetcher{Client: client}
}

// Fetch implements Fetcher.
func (f *HTTPFetcher) Fetch(ctx context.Context, url string) (map[string][]string, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, nil, err
	}
	resp, err := f.Client.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, nil, fmt.Errorf("HTTP %s", resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxDocumentSize+1))
	if err != nil {
		return nil, nil, err
	}
	if len(body) > MaxDocumentSize {
		return nil, nil, fmt.Errorf("more than %d bytes", MaxDocumentSize)
	}
	return resp.Header, body, nil
}
