package vtpm

import (
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/openconstellation/constellation/pkg/attestation/internal/memo"
)

// certCache remembers certificates whose chain verified, so that the chain's signature checks
// (an ECDSA verify alone costs ~105 µs here, more than our whole per-evidence budget) run once
// per certificate instead of once per evidence. A hit still checks the validity window of the
// whole chain against the current time. Keyed by SHA-256 of the DER, so a modified
// certificate is a miss. Bounded: when full it is cleared, which costs only re-verification.
type certCache struct {
	memo *memo.Memo[[32]byte, certEntry]
}

type certEntry struct {
	cert                *x509.Certificate
	notBefore, notAfter time.Time // intersection of the validity of the verified chain
}

func newCertCache(max int) *certCache {
	return &certCache{memo: memo.New[[32]byte, certEntry](max)}
}

// verify returns the parsed leaf of der after verifyChain accepted it (now or earlier).
func (c *certCache) verify(der []byte, now time.Time, verifyChain func(*x509.Certificate) ([][]*x509.Certificate, error)) (*x509.Certificate, error) {
	key := sha256.Sum256(der)
	if e, ok := c.memo.Get(key); ok {
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
	e := certEntry{cert: cert}
	e.notBefore, e.notAfter = memo.ValidityOf(chains[0])
	c.memo.Put(key, e)
	return cert, nil
}
