// Package memo is the bounded, concurrency-safe memo the validators keep of checks that depend
// only on bytes they have seen before (a certificate chain, a CRL's signature, a report's
// signature, an event-log replay): the expensive check runs once per distinct input instead of
// once per evidence. Keys must name the input exactly (a digest of all of it), so any change
// is a miss, and only successful checks are stored.
//
// When full the memo is cleared: that costs only repeating checks, and keeps the bound
// without tracking recency on the hot path.
package memo

import (
	"crypto/x509"
	"sync"
	"time"
)

// Memo maps keys to values, holding at most a fixed number of entries.
type Memo[K comparable, V any] struct {
	mu      sync.Mutex
	max     int
	entries map[K]V
}

// New returns an empty memo of at most max entries.
func New[K comparable, V any](max int) *Memo[K, V] {
	return &Memo[K, V]{max: max, entries: map[K]V{}}
}

// Get returns the value remembered for k.
func (m *Memo[K, V]) Get(k K) (V, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.entries[k]
	return v, ok
}

// Put remembers v for k, clearing the memo first if it is full.
func (m *Memo[K, V]) Put(k K, v V) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.entries[k]; !ok && len(m.entries) >= m.max {
		clear(m.entries)
	}
	m.entries[k] = v
}

// Len returns the number of entries.
func (m *Memo[K, V]) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.entries)
}

// ValidityOf returns when every certificate of chain is valid (the intersection of their
// validity windows): what a memo of a verified chain must still check against the time.
func ValidityOf(chain []*x509.Certificate) (notBefore, notAfter time.Time) {
	for i, c := range chain {
		if i == 0 || c.NotBefore.After(notBefore) {
			notBefore = c.NotBefore
		}
		if i == 0 || c.NotAfter.Before(notAfter) {
			notAfter = c.NotAfter
		}
	}
	return notBefore, notAfter
}
