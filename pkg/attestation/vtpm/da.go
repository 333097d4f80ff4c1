package vtpm

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/google/go-tpm/legacy/tpm2"

	"github.com/openconstellation/constellation/pkg/attestation"
)

// DAState is a TPM's dictionary-attack (DA) protection state, as TPM2_GetCapability reports
// it (TPM_CAP_TPM_PROPERTIES).
//
// A TPM counts authorization failures of DA-protected objects (objects without noDA, NV
// indexes without TPMA_NV_NO_DA, the lockout hierarchy) in failedTries. It also counts a
// start-up that follows a power loss (no TPM2_Shutdown before it) as one failure, if a
// DA-protected object was used since the start-up before. Once failedTries reaches
// maxTries the TPM is in lockout: it refuses every authorization of a DA-protected object
// (TPM_RC_LOCKOUT) until failedTries drops below maxTries again. It forgives one failure per
// recoveryTime of uninterrupted operation; a start-up starts that wait again. Only
// TPM2_DictionaryAttackLockReset, authorized by the lockout hierarchy, ends a lockout at once.
type DAState struct {
	// FailedTries is TPM_PT_LOCKOUT_COUNTER.
	FailedTries uint32
	// MaxTries is TPM_PT_MAX_AUTH_FAIL: the lockout begins at this many failures.
	MaxTries uint32
	// RecoveryTime is TPM_PT_LOCKOUT_INTERVAL: one failure is forgiven per interval of
	// uptime. Zero disables DA protection.
	RecoveryTime time.Duration
	// LockoutRecovery is TPM_PT_LOCKOUT_RECOVERY: the wait after a failed authorization of
	// the lockout hierarchy itself.
	LockoutRecovery time.Duration
	// InLockout is TPMA_PERMANENT.inLockout.
	InLockout bool
	// LockoutAuthSet is TPMA_PERMANENT.lockoutAuthSet: the lockout hierarchy has a
	// non-empty authorization value.
	LockoutAuthSet bool
}

// TPMA_PERMANENT bits (TPM 2.0 Part 2, TPMA_PERMANENT).
const (
	permanentLockoutAuthSet = 1 << 2
	permanentInLockout      = 1 << 9
)

// DAState reads the TPM's dictionary-attack state.
func (t *TPM) DAState() (DAState, error) {
	var s DAState
	err := t.With(func(rw io.ReadWriter) error {
		// TPMA_PERMANENT through TPM_PT_LOCKOUT_RECOVERY are consecutive properties.
		first, last := tpm2.TPMAPermanent, tpm2.LockoutRecovery
		vals, _, err := tpm2.GetCapability(rw, tpm2.CapabilityTPMProperties, uint32(last-first)+1, uint32(first))
		if err != nil {
			return err
		}
		got := map[tpm2.TPMProp]uint32{}
		for _, v := range vals {
			if p, ok := v.(tpm2.TaggedProperty); ok {
				got[p.Tag] = p.Value
			}
		}
		for _, want := range []tpm2.TPMProp{first, tpm2.LockoutCounter, tpm2.MaxAuthFail, tpm2.LockoutInterval, last} {
			if _, ok := got[want]; !ok {
				return fmt.Errorf("the TPM did not report property %#x", uint32(want))
			}
		}
		s = DAState{
			FailedTries:     got[tpm2.LockoutCounter],
			MaxTries:        got[tpm2.MaxAuthFail],
			RecoveryTime:    time.Duration(got[tpm2.LockoutInterval]) * time.Second,
			LockoutRecovery: time.Duration(got[tpm2.LockoutRecovery]) * time.Second,
			InLockout:       got[first]&permanentInLockout != 0,
			LockoutAuthSet:  got[first]&permanentLockoutAuthSet != 0,
		}
		return nil
	})
	if err != nil {
		return DAState{}, fmt.Errorf("reading the dictionary-attack state of %s: %w", t.desc, err)
	}
	return s, nil
}

// LockedOut reports whether the TPM refuses DA-protected authorizations now.
func (s DAState) LockedOut() bool { return s.InLockout || s.FailedTries >= s.MaxTries }

// ClearsAfter returns how much uninterrupted uptime the TPM needs, at most and with no new
// failure, until it accepts DA-protected authorizations again (zero if it does now), and
// false if it never gets out of lockout by itself (DA recovery disabled, or no failure
// allowed at all): then only TPM2_DictionaryAttackLockReset ends it.
func (s DAState) ClearsAfter() (time.Duration, bool) {
	if !s.LockedOut() {
		return 0, true
	}
	if s.MaxTries == 0 || s.RecoveryTime == 0 {
		return 0, false
	}
	// The lockout ends when failedTries drops below maxTries: one failure per interval. The
	// first interval may have partly passed; the TPM does not say how much.
	excess := uint32(1)
	if s.FailedTries >= s.MaxTries {
		excess = s.FailedTries - s.MaxTries + 1
	}
	return time.Duration(excess) * s.RecoveryTime, true
}

func (s DAState) String() string {
	return fmt.Sprintf("%d of %d authorization failures, one forgiven every %s of uptime", s.FailedTries, s.MaxTries, s.RecoveryTime)
}

// IsLockout reports whether err is a TPM's TPM_RC_LOCKOUT: it refused a DA-protected
// authorization because it is in dictionary-attack lockout.
func IsLockout(err error) bool {
	var w tpm2.Warning
	return errors.As(err, &w) && w.Code == tpm2.RCLockout
}

// QuoteFailure says why a TPM did not quote, for the operator: the error, and for a
// lockout the TPM's DA state and when it clears.
type QuoteFailure struct {
	// Err is what loading the attestation key or quoting returned.
	Err error
	// At is when it failed.
	At time.Time
	// DA is the TPM's DA state, read after the failure; nil if it could not be read
	// (DAErr says why).
	DA    *DAState
	DAErr error
}

func (f *QuoteFailure) Error() string { return f.Reason() }
func (f *QuoteFailure) Unwrap() error { return f.Err }

// Lockout reports whether the TPM refused the quote because it is in DA lockout.
func (f *QuoteFailure) Lockout() bool { return IsLockout(f.Err) }

// ClearsBy returns when a lockout ends at the latest if the TPM keeps running with no new
// failure, and false if the failure is no lockout, its DA state is unknown, or it never ends
// by itself.
func (f *QuoteFailure) ClearsBy() (time.Time, bool) {
	if !f.Lockout() || f.DA == nil {
		return time.Time{}, false
	}
	d, ok := f.DA.ClearsAfter()
	if !ok {
		return time.Time{}, false
	}
	return f.At.Add(d), true
}

// Reason is one line for the operator: what failed and, for a lockout, the DA state and
// when it clears.
func (f *QuoteFailure) Reason() string {
	if !f.Lockout() {
		return fmt.Sprintf("the TPM cannot quote: %v", f.Err)
	}
	msg := "the TPM is in dictionary-attack lockout and refuses the attestation key, which is DA-protected"
	if f.DA == nil {
		return fmt.Sprintf("%s (DA state unknown: %v)", msg, f.DAErr)
	}
	msg += " (" + f.DA.String() + ")"
	if by, ok := f.ClearsBy(); ok {
		d, _ := f.DA.ClearsAfter()
		return fmt.Sprintf("%s; it clears after at most %s of uninterrupted uptime, by %s if the node is not restarted (a restart starts the wait again)",
			msg, d, by.UTC().Format(time.RFC3339))
	}
	return msg + "; it does not clear by itself: only TPM2_DictionaryAttackLockReset with the lockout authorization ends it"
}

// DAReader reads a TPM's dictionary-attack state: *TPM, PerUseTPM.
type DAReader interface {
	DAState() (DAState, error)
}

// CheckQuote makes iss issue evidence for attestation.PurposeSelfCheck over a fresh random
// nonce and discards it: the quote every interface of the node depends on, tried before
// any of them is offered. It returns nil if the TPM quoted, else why not (see Diagnose).
func CheckQuote(ctx context.Context, iss attestation.Issuer, da DAReader, now time.Time) *QuoteFailure {
	nonce := make([]byte, attestation.MinNonceSize)
	if _, err := rand.Read(nonce); err != nil {
		return &QuoteFailure{Err: err, At: now}
	}
	_, err := iss.Issue(ctx, attestation.PurposeSelfCheck, nonce)
	if err == nil {
		return nil
	}
	return Diagnose(err, da, now)
}

// Diagnose explains err, a failure to load the attestation key or to quote at now; for a
// lockout it reads the TPM's DA state from da (nil: unknown).
func Diagnose(err error, da DAReader, now time.Time) *QuoteFailure {
	f := &QuoteFailure{Err: err, At: now}
	if !f.Lockout() {
		return f
	}
	if da == nil {
		f.DAErr = errors.New("no TPM to ask")
		return f
	}
	s, err := da.DAState()
	if err != nil {
		f.DAErr = err
		return f
	}
	f.DA = &s
	return f
}
