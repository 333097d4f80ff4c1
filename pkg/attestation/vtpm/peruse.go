package vtpm

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// Opener opens a TPM for one use; the caller closes it.
type Opener func(ctx context.Context) (*TPM, error)

// OpenAddr returns an Opener for Open(ctx, addr).
func OpenAddr(addr string) Opener {
	return func(ctx context.Context) (*TPM, error) { return Open(ctx, addr) }
}

// PerUseIssuer issues the same evidence as Issuer but holds no connection to the TPM between
// uses: it opens the TPM for every Issue and closes it right after. This is how services
// share a node's swtpm, which serves one connection at a time (docs/local-provider.md): a
// held connection would block the bootstrapper and every other service of the node.
//
// Uses within the process are serialized (one connection at a time, in order of arrival);
// a caller whose context ends while it waits, or while the TPM is busy with another process,
// gets an error instead of waiting for the TPM's command timeout.
type PerUseIssuer struct {
	open     Opener
	turn     chan struct{} // one use at a time
	variant  variant.Variant
	akPublic []byte

	mu  sync.Mutex
	cfg IssuerConfig // AKCert is filled in once read from the TPM's NV
}

// NewPerUseIssuer checks that the TPM can be opened and has (or can create) the AK of cfg,
// remembers the AK's public area and certificate, and closes the TPM again.
func NewPerUseIssuer(ctx context.Context, open Opener, cfg IssuerConfig) (*PerUseIssuer, error) {
	if open == nil {
		return nil, errors.New("per-use issuer: no TPM opener")
	}
	p := &PerUseIssuer{open: open, turn: make(chan struct{}, 1), variant: cfg.Variant, cfg: cfg}
	err := p.use(ctx, func(iss *Issuer) error {
		p.akPublic = iss.AKPublic()
		return nil
	})
	if err != nil {
		return nil, err
	}
	return p, nil
}

// Variant returns the variant written into the evidence.
func (p *PerUseIssuer) Variant() variant.Variant { return p.variant }

// AKPublic returns the TPMT_PUBLIC encoding of the attestation key.
func (p *PerUseIssuer) AKPublic() []byte { return p.akPublic }

// Issue opens the TPM, quotes all SHA-256 PCRs for purpose and data (see Issuer.Issue), and
// closes the TPM.
func (p *PerUseIssuer) Issue(ctx context.Context, purpose attestation.Purpose, data []byte) ([]byte, error) {
	var evidence []byte
	err := p.use(ctx, func(iss *Issuer) error {
		var err error
		evidence, err = iss.Issue(ctx, purpose, data)
		return err
	})
	return evidence, err
}

// use runs fn with an issuer on a freshly opened TPM, closed when fn returns.
func (p *PerUseIssuer) use(ctx context.Context, fn func(*Issuer) error) error {
	select {
	case p.turn <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("waiting for the TPM: %w", ctx.Err())
	}
	defer func() { <-p.turn }()

	return p.open.use(ctx, func(tpm *TPM) error {
		return p.withIssuer(ctx, tpm, fn)
	})
}

// withIssuer runs fn with an issuer of cfg on the opened tpm.
func (p *PerUseIssuer) withIssuer(ctx context.Context, tpm *TPM, fn func(*Issuer) error) error {
	p.mu.Lock()
	cfg := p.cfg
	p.mu.Unlock()
	iss, err := NewIssuer(tpm, cfg)
	if err != nil {
		return err
	}
	defer iss.Close()
	if cfg.AKCert == nil && iss.AKCert() != nil {
		// Read from NV once; later uses need not read it again.
		p.mu.Lock()
		p.cfg.AKCert = iss.AKCert()
		p.mu.Unlock()
	}
	if err := fn(iss); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%w (%w)", err, ctx.Err())
		}
		return err
	}
	return nil
}

// use opens the TPM, runs fn on it, and closes it; a TPM command in flight aborts when ctx
// ends.
func (open Opener) use(ctx context.Context, fn func(*TPM) error) error {
	tpm, err := open(ctx)
	if err != nil {
		return err
	}
	defer tpm.Close()
	stop := tpm.abortOn(ctx)
	defer stop()
	return fn(tpm)
}

// PerUseTimeout bounds one use of a PerUseTPM (opening included): the TPM may be busy with
// another process of the node for a while, but not forever.
const PerUseTimeout = 30 * time.Second

// PerUseTPM reads and extends PCRs like TPM, opening the TPM for each call and closing it
// right after (see PerUseIssuer): the bootstrapper holds no connection while the node's
// services need the TPM.
type PerUseTPM struct {
	Open Opener
}

func (p PerUseTPM) use(fn func(*TPM) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), PerUseTimeout)
	defer cancel()
	return p.Open.use(ctx, fn)
}

// ReadPCRs is TPM.ReadPCRs on a freshly opened TPM.
func (p PerUseTPM) ReadPCRs(pcrs ...int) (map[uint32][]byte, error) {
	var out map[uint32][]byte
	err := p.use(func(t *TPM) error {
		var err error
		out, err = t.ReadPCRs(pcrs...)
		return err
	})
	return out, err
}

// ExtendPCR is TPM.ExtendPCR on a freshly opened TPM.
func (p PerUseTPM) ExtendPCR(idx int, digest []byte) error {
	return p.use(func(t *TPM) error { return t.ExtendPCR(idx, digest) })
}

// DAState is TPM.DAState on a freshly opened TPM.
func (p PerUseTPM) DAState() (DAState, error) {
	var out DAState
	err := p.use(func(t *TPM) error {
		var err error
		out, err = t.DAState()
		return err
	})
	return out, err
}

// ReadPlatformNV is TPM.ReadPlatformNV on a freshly opened TPM.
func (p PerUseTPM) ReadPlatformNV(index uint32) ([]byte, error) {
	var out []byte
	err := p.use(func(t *TPM) error {
		var err error
		out, err = t.ReadPlatformNV(index)
		return err
	})
	return out, err
}
