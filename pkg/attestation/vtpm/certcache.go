package vtpm

import (
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"time"
)

// certCache remembers certificates whose chain verified, so that the chain's signature checks
// (an ECDSA verify alone costs ~105 µs here, more than our whole per-evidence budget) run once
// per certificate instead of once per evidence. A hit still checks the validity window of the
// whole chain against the current time. Keyed by SHA-256 of the DER, so a modified
// certificate is a miss. Bounded: when full it is cleared, which costs only re-verification.
type certCache struct {
	mu      sync.Mutex
	max     int
	entries map[[32]byte]certEntry
}

type certEntry struct {
	cert                *x509.Certificate
	notBefore, notAfter time.Time // intersection of the validity of the verified chain
}

func newCertCache(max int) *certCache {
	return &certCache{max: max, entries: map[[32]byte]certEntry{}}
}

// verify returns the parsed leaf of der after verifyChain accepted it (now or earlier).
func (c *certCache) verify(der []byte, now time.Time, verifyChain func(*x509.Certificate) ([][]*x509.Certificate, error)) (*x509.Certificate, error) {
	key := sha256.Sum256(der)
	c.mu.Lock()
	e, ok := c.entries[key]
	c.mu.Unlock()
	if ok {
		if now.Before(e.notBefore) || now.After(e.notAfter) {
			return nil, fmt.Errorf("certificate chain not valid at %s (valid %s to %s)", now.UTC().Format(time.RFC3339), e.notBefore.UTC().Format(time.RFC3339), e.notAfter.UTC().Format(time.RFC3339))
		}
		return e.cert, nil
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	chains, err := verifyChain(cert)
	if err != nil {
		return nil, err
	}
	if len(chains) == 0 {
		return nil, errors.New("no verified chain")
	}
	e = certEntry{cert: cert, notBefore: cert.NotBefore, notAfter: cert.NotAfter}
	for _, c := range chains[0] {
		if c.NotBefore.After(e.notBefore) {
			e.notBefore = c.NotBefore
		}
		if c.NotAfter.Before(e.notAfter) {
			e.notAfter = c.NotAfter
		}
	}
	c.mu.Lock()
	if len(c.entries) >= c.max {
		clear(c.entries)
	}
	c.entries[key] = e
	c.mu.Unlock()
	return cert, nil
}
