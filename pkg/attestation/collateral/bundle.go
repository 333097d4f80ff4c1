package collateral

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/openconstellation/constellation/pkg/strictjson"
)

// A bundle carries collateral from a verifier with network to one without: a JSON array of
// the documents (URL, response headers, body), written by a Recorder around the online
// verifier's fetcher and loaded into the offline verifier's cache with PutBundle. Nothing in
// a bundle is trusted: it only saves fetches, and every document is checked (signature,
// validity, next update) when a validator uses it, as a fetched one is.

// BundleEntry is one document of a bundle.
type BundleEntry struct {
	URL    string              `json:"url"`
	Header map[string][]string `json:"header,omitempty"`
	// Body is the document as served (base64 in JSON).
	Body []byte `json:"body"`
}

// MaxBundleSize bounds a bundle: a few CRLs and Intel's TCB documents are well under 1 MiB.
const MaxBundleSize = 8 << 20

// MaxBundleEntries bounds the documents of a bundle.
const MaxBundleEntries = 256

// ParseBundle decodes a bundle strictly (size-bounded; strictjson.Unmarshal: no unknown
// field, no field twice or in other letter case, no trailing data; every entry with a URL
// and a body).
func ParseBundle(data []byte) ([]BundleEntry, error) {
	if len(data) > MaxBundleSize {
		return nil, fmt.Errorf("collateral bundle of %d bytes, limit %d", len(data), MaxBundleSize)
	}
	var entries []BundleEntry
	if err := strictjson.Unmarshal(data, &entries); err != nil {
		return nil, fmt.Errorf("collateral bundle: %w", err)
	}
	if len(entries) > MaxBundleEntries {
		return nil, fmt.Errorf("collateral bundle of %d documents, limit %d", len(entries), MaxBundleEntries)
	}
	for i, e := range entries {
		if e.URL == "" || len(e.Body) == 0 {
			return nil, fmt.Errorf("collateral bundle: document %d has no URL or no body", i)
		}
		if len(e.Body) > MaxDocumentSize {
			return nil, fmt.Errorf("collateral bundle: document %d (%s) of %d bytes, limit %d", i, e.URL, len(e.Body), MaxDocumentSize)
		}
	}
	return entries, nil
}

// PutBundle puts every document of a bundle into the cache (Put). A document already past its
// next update is refused, naming its URL: an old bundle says so rather than fail later.
func (c *Cache) PutBundle(entries []BundleEntry) error {
	var errs []error
	for _, e := range entries {
		if err := c.Put(e.URL, e.Header, e.Body); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", e.URL, err))
		}
	}
	return errors.Join(errs...)
}

// Recorder is a Fetcher that keeps every document its Fetcher returned, for a bundle.
type Recorder struct {
	Fetcher Fetcher

	mu      sync.Mutex
	entries []BundleEntry
}

// Fetch implements Fetcher.
func (r *Recorder) Fetch(ctx context.Context, url string) (map[string][]string, []byte, error) {
	header, body, err := r.Fetcher.Fetch(ctx, url)
	if err == nil {
		r.mu.Lock()
		r.entries = append(r.entries, BundleEntry{URL: url, Header: header, Body: body})
		r.mu.Unlock()
	}
	return header, body, err
}

// Bundle returns the documents fetched so far.
func (r *Recorder) Bundle() []BundleEntry {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]BundleEntry(nil), r.entries...)
}
