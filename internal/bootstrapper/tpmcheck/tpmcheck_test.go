package tpmcheck_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/bootstrapper/tpmcheck"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/vtpmtest"
)

// reports records what Wait told the platform.
type reports struct {
	mu   sync.Mutex
	list []report
}

type report struct {
	at            time.Time
	phase, detail string
}

func (r *reports) report(phase, detail string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.list = append(r.list, report{time.Now(), phase, detail})
}

func (r *reports) all() []report {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]report(nil), r.list...)
}

func perUse(addr string, cfg vtpm.IssuerConfig) func(ctx context.Context) (attestation.Issuer, error) {
	return func(ctx context.Context) (attestation.Issuer, error) {
		return vtpm.NewPerUseIssuer(ctx, vtpm.OpenAddr(addr), cfg)
	}
}

// A TPM that quotes: Wait returns at once and reports nothing.
func TestWaitQuotingTPM(t *testing.T) {
	proc := vtpmtest.SwtpmProcess(t)
	var r reports
	iss, err := tpmcheck.Wait(t.Context(), tpmcheck.Config{
		NewIssuer: perUse(proc.Addr(), vtpm.IssuerConfig{Variant: variant.QEMUVTPM}),
		DA:        vtpm.PerUseTPM{Open: vtpm.OpenAddr(proc.Addr())}, Report: r.report,
	})
	require.NoError(t, err)
	require.NotNil(t, iss)
	assert.Empty(t, r.all())
}

// A TPM in dictionary-attack lockout that refuses a DA-protected attestation key (a
// platform's AK without noDA): the node reports the phase once, with the reason and when
// the lockout clears, and goes on (reporting booting) once the TPM quotes again, by then.
func TestWaitReportsLockoutUntilItClears(t *testing.T) {
	proc := vtpmtest.SwtpmProcess(t)
	tpm, err := proc.Open(t.Context())
	require.NoError(t, err)
	const recovery = 3 * time.Second
	vtpmtest.LockOut(t, tpm, recovery)
	require.NoError(t, tpm.Close())

	var r reports
	start := time.Now()
	iss, err := tpmcheck.Wait(t.Context(), tpmcheck.Config{
		NewIssuer: perUse(proc.Addr(), vtpm.IssuerConfig{Variant: variant.QEMUVTPM, LoadAK: vtpmtest.LoadDAProtectedAK}),
		DA:        vtpm.PerUseTPM{Open: vtpm.OpenAddr(proc.Addr())}, Report: r.report,
		Interval: 10 * time.Second, // longer than the lockout: Wait checks at the time the TPM told
	})
	require.NoError(t, err)
	require.NotNil(t, iss)
	took := time.Since(start)

	got := r.all()
	require.Len(t, got, 2, "%v", got)
	assert.Equal(t, metadata.PhaseTPMCannotQuote, got[0].phase)
	assert.Contains(t, got[0].detail, "dictionary-attack lockout")
	assert.Contains(t, got[0].detail, "2 of 2 authorization failures, one forgiven every 3s of uptime")
	i := strings.Index(got[0].detail, "by ")
	require.GreaterOrEqual(t, i, 0, got[0].detail)
	by, err := time.Parse(time.RFC3339, strings.Fields(got[0].detail[i+3:])[0])
	require.NoError(t, err, got[0].detail)
	assert.WithinDuration(t, start.Add(recovery), by, 2*time.Second, "the reported clear time")
	assert.Equal(t, report{at: got[1].at, phase: metadata.PhaseBooting}, got[1], "booting again once the TPM quotes")
	assert.False(t, got[1].at.After(by.Add(2*time.Second)), "cleared by the reported time: %s, reported %s", got[1].at, by)
	assert.Less(t, took, 10*time.Second, "not a whole interval: Wait checked when the lockout should end")
}

// A TPM that cannot be reached is reported with the cause, and checked again until the
// context ends.
func TestWaitUnreachableTPM(t *testing.T) {
	var r reports
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	_, err := tpmcheck.Wait(ctx, tpmcheck.Config{
		NewIssuer: perUse("unix:/nonexistent/tpm.sock", vtpm.IssuerConfig{Variant: variant.QEMUVTPM}),
		Report:    r.report, Interval: 100 * time.Millisecond,
	})
	require.Error(t, err)
	assert.True(t, errors.Is(err, context.DeadlineExceeded), "%v", err)
	got := r.all()
	require.Len(t, got, 1, "the same failure is reported once: %v", got)
	assert.Equal(t, metadata.PhaseTPMCannotQuote, got[0].phase)
	assert.Contains(t, got[0].detail, "the TPM cannot quote: loading the attestation key")
	assert.Contains(t, got[0].detail, "/nonexistent/tpm.sock")
}
