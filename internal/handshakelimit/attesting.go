package handshakelimit

import (
	"fmt"
	"time"

	"github.com/openconstellation/constellation/pkg/atls"
	"github.com/openconstellation/constellation/pkg/attestation"
)

// NewAttestingServer builds what a node's server that attests to anonymous callers needs (the
// init server, the recovery server): attested-channel credentials whose handshakes pass the
// handshakes limits before the node quotes, and a limiter for the calls that follow on a
// connection (attempts), which one connection can carry any number of.
func NewAttestingServer(issuer attestation.Issuer, handshakes, attempts Limits, now func() time.Time) (*atls.Credentials, *Limiter, error) {
	handshakeLimiter, err := New(handshakes, now)
	if err != nil {
		return nil, nil, err
	}
	attemptLimiter, err := New(attempts, now)
	if err != nil {
		return nil, nil, err
	}
	creds, err := atls.NewCredentials(atls.Config{Issuer: issuer, Admit: handshakeLimiter.Admit})
	if err != nil {
		return nil, nil, fmt.Errorf("attested-channel credentials: %w", err)
	}
	return creds, attemptLimiter, nil
}
