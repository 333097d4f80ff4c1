package collateral

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBundleRoundTrip: what an online verifier fetched through a Recorder, an offline cache
// serves after PutBundle; an old bundle is refused by URL.
func TestBundleRoundTrip(t *testing.T) {
	c := newClock()
	const url = "https://kds.example/crl"
	online := &Recorder{Fetcher: &fakeFetcher{docs: map[string][]byte{url: testCRL(t, c.Now().Add(48*time.Hour))}}}
	_, err := New(Config{Fetcher: online, Now: c.Now}).Get(ctx(t), url)
	require.NoError(t, err)
	data, err := json.Marshal(online.Bundle())
	require.NoError(t, err)

	entries, err := ParseBundle(data)
	require.NoError(t, err)
	offline := New(Config{Now: c.Now})
	require.NoError(t, offline.PutBundle(entries))
	doc, err := offline.Get(ctx(t), url)
	require.NoError(t, err)
	assert.Equal(t, online.Bundle()[0].Body, doc.Body)

	later := New(Config{Now: func() time.Time { return c.Now().Add(72 * time.Hour) }})
	err = later.PutBundle(entries)
	assert.ErrorIs(t, err, ErrStale)
	assert.ErrorContains(t, err, url)
}

func TestParseBundleRejects(t *testing.T) {
	for name, data := range map[string]string{
		"not JSON":      "CRL",
		"object":        `{"url":"x"}`,
		"unknown field": `[{"url":"x","body":"AQ==","extra":1}]`,
		"no URL":        `[{"body":"AQ=="}]`,
		"no body":       `[{"url":"x"}]`,
		"trailing data": `[] []`,
		"body not b64":  `[{"url":"x","body":"!"}]`,
		// One reading only: which document a URL is cached for must not depend on the reader.
		"url twice":      `[{"url":"https://a.example/crl","url":"https://b.example/crl","body":"AQ=="}]`,
		"URL beside url": `[{"url":"https://a.example/crl","URL":"https://b.example/crl","body":"AQ=="}]`,
		"body twice":     `[{"url":"x","body":"AQ==","body":"Ag=="}]`,
	} {
		_, err := ParseBundle([]byte(data))
		assert.Error(t, err, name)
	}
	_, err := ParseBundle(make([]byte, MaxBundleSize+1))
	assert.ErrorContains(t, err, "limit")
}

// FuzzParseBundle: any input is a bundle or an error, never a panic; what parses is within
// the limits.
func FuzzParseBundle(f *testing.F) {
	f.Add([]byte(`[{"url":"https://kds.example/crl","header":{"A":["b"]},"body":"AQID"}]`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`[{"url":"x","body":"AQ=="}] x`))
	f.Fuzz(func(t *testing.T, data []byte) {
		entries, err := ParseBundle(data)
		if err != nil {
			return
		}
		assert.LessOrEqual(t, len(entries), MaxBundleEntries)
		for _, e := range entries {
			assert.NotEmpty(t, e.URL)
			assert.NotEmpty(t, e.Body)
		}
		_ = New(Config{}).PutBundle(entries)
	})
}
