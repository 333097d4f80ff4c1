// Package tpmcheck holds a node back until its TPM quotes, and tells the platform why while
// it does not.
//
// Everything a node offers (the init server, the join and rejoin client, the recovery
// server, the verification service) starts with a quote. A TPM that cannot quote (in
// dictionary-attack lockout for a DA-protected attestation key, in failure mode, gone) made
// every attested handshake fail, and the node kept trying silently: the operator saw a node
// waiting for recovery that `recover` could never reach. So before the bootstrapper offers
// anything, it loads its attestation key and quotes once; while that fails it reports
// metadata.PhaseTPMCannotQuote with the reason (for a lockout: the TPM's DA state and when
// it clears) and checks again.
package tpmcheck

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
)

// DefaultInterval is how often a TPM that cannot quote is checked again. A check costs one
// quote (a few milliseconds); a lockout ends at a time the TPM's DA state tells, and the check
// is then made at once.
const DefaultInterval = 5 * time.Second

// Config is what Wait checks and whom it tells.
type Config struct {
	// NewIssuer loads the node's attestation key; it is called again until it succeeds.
	NewIssuer func(ctx context.Context) (attestation.Issuer, error)
	// DA reads the TPM's dictionary-attack state, for a lockout's report (nil: not read).
	DA vtpm.DAReader
	// Report tells the platform the node's phase and why (it must not block): the phase
	// metadata.PhaseTPMCannotQuote with the reason while the TPM cannot quote, and
	// metadata.PhaseBooting once it quotes again. Nothing if the first check passes.
	Report func(phase, detail string)
	// Interval between checks (DefaultInterval when zero).
	Interval time.Duration
	Log      *slog.Logger
	// Now is the clock of the reports (time.Now when nil).
	Now func() time.Time
}

// Wait returns an issuer of cfg once its TPM quoted, or an error when ctx ends first.
func Wait(ctx context.Context, cfg Config) (attestation.Issuer, error) {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Report == nil {
		cfg.Report = func(string, string) {}
	}
	var iss attestation.Issuer
	var reported *vtpm.QuoteFailure
	for checks := 1; ; checks++ {
		now := cfg.Now()
		var failure *vtpm.QuoteFailure
		if iss == nil {
			var err error
			if iss, err = cfg.NewIssuer(ctx); err != nil {
				iss, failure = nil, vtpm.Diagnose(fmt.Errorf("loading the attestation key: %w", err), cfg.DA, now)
			}
		}
		if iss != nil {
			failure = vtpm.CheckQuote(ctx, iss, cfg.DA, now)
		}
		if failure == nil {
			if reported != nil {
				cfg.Log.Info("the TPM quotes again", "checks", checks)
				cfg.Report(metadata.PhaseBooting, "")
			}
			return iss, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("waiting for the TPM to quote (%v): %w", failure, ctx.Err())
		}
		// The first report of a lockout has the earliest time by which it clears: a later
		// check of the same state would only push that bound out.
		if reported == nil || !sameFailure(reported, failure) {
			reported = failure
			cfg.Log.Error("the TPM cannot quote: the node offers nothing until it does", "reason", failure.Reason(), "checks", checks)
			cfg.Report(metadata.PhaseTPMCannotQuote, failure.Reason())
		}
		// Check again when the lockout should have ended, if that is sooner.
		wait := cfg.Interval
		if by, ok := reported.ClearsBy(); ok {
			if d := by.Sub(cfg.Now()); d > 0 {
				wait = min(wait, d)
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for the TPM to quote (%v): %w", failure, ctx.Err())
		case <-time.After(wait):
		}
	}
}

// sameFailure reports whether b is the failure a was: the same error, and for a lockout the
// same DA state.
func sameFailure(a, b *vtpm.QuoteFailure) bool {
	if a.Err.Error() != b.Err.Error() || (a.DA == nil) != (b.DA == nil) {
		return false
	}
	return a.DA == nil || *a.DA == *b.DA
}
