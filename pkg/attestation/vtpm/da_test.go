package vtpm_test

import (
	"context"
	"io"
	"os"
	"testing"
	"time"

	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/swtpm"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/vtpmtest"
)

var testVariant = variant.QEMUVTPM

// TestAKTemplate: both AKs are restricted signing keys that never leave the TPM, without
// dictionary-attack protection, and an AK of the earlier template (DA-protected) at the
// handle is replaced by one of the current template.
func TestAKTemplate(t *testing.T) {
	tpm := vtpmtest.Simulator(t)
	for _, alg := range vtpm.AKAlgorithms {
		t.Run(alg.String(), func(t *testing.T) {
			tmpl, err := alg.Template()
			require.NoError(t, err)
			assert.Equal(t, tpm2.FlagSignerDefault|tpm2.FlagNoDA, tmpl.Attributes)

			// An AK of the earlier template at the AK's handle, as an earlier version left it.
			old := client.AKTemplateRSA()
			if alg == vtpm.AKECC {
				old = client.AKTemplateECC()
			}
			var oldPub tpm2.Public
			require.NoError(t, tpm.With(func(rw io.ReadWriter) error {
				k, err := client.NewCachedKey(rw, tpm2.HandleOwner, old, alg.Handle())
				if err != nil {
					return err
				}
				defer k.Close()
				oldPub = k.PublicArea()
				return nil
			}))
			require.Zero(t, oldPub.Attributes&tpm2.FlagNoDA)

			iss, err := vtpm.NewIssuer(tpm, vtpm.IssuerConfig{Variant: testVariant, AK: alg})
			require.NoError(t, err)
			t.Cleanup(func() { _ = iss.Close() })
			pub, err := tpm2.DecodePublic(iss.AKPublic())
			require.NoError(t, err)
			assert.Equal(t, vtpm.AKAttributes, pub.Attributes, "the AK at the handle is of the current template")
			assert.True(t, pub.MatchesTemplate(tmpl))
			_, err = vtpm.CheckAKAttributes(pub)
			assert.NoError(t, err, "validators accept it")
			_, err = iss.Issue(t.Context(), attestation.PurposeVerify, make([]byte, 32))
			assert.NoError(t, err)
		})
	}
}

// restartableSwtpm is a swtpm whose state directory outlives its processes: a machine's TPM
// across power cycles.
type restartableSwtpm struct {
	t    *testing.T
	dir  string
	proc *swtpm.Process
}

func newRestartableSwtpm(t *testing.T) *restartableSwtpm {
	if testing.Short() {
		t.Skip("integration tier (make integration): runs swtpm")
	}
	// os.MkdirTemp, not t.TempDir: socket paths are limited to 107 bytes.
	dir, err := os.MkdirTemp("", "swtpm-da")
	require.NoError(t, err)
	s := &restartableSwtpm{t: t, dir: dir}
	t.Cleanup(func() {
		if s.proc != nil {
			_ = s.proc.Kill()
		}
		_ = os.RemoveAll(dir)
	})
	s.start()
	return s
}

func (s *restartableSwtpm) start() {
	s.t.Helper()
	proc, err := swtpm.Start(context.Background(), swtpm.Options{StateDir: s.dir})
	require.NoError(s.t, err)
	s.proc = proc
}

// powerCut kills swtpm (no TPM2_Shutdown) and starts it again on the same state.
func (s *restartableSwtpm) powerCut() {
	s.t.Helper()
	require.NoError(s.t, s.proc.Kill())
	s.start()
}

// use opens the TPM for fn, as the node's processes do (one connection at a time).
func (s *restartableSwtpm) use(fn func(tpm *vtpm.TPM)) {
	s.t.Helper()
	tpm, err := s.proc.Open(context.Background())
	require.NoError(s.t, err)
	defer tpm.Close()
	fn(tpm)
}

// quoteAll loads every AK (as the provider does at boot) and quotes with each (as the node
// does). It returns the first error.
func quoteAll(tpm *vtpm.TPM, cfgs ...vtpm.IssuerConfig) error {
	for _, cfg := range cfgs {
		iss, err := vtpm.NewIssuer(tpm, cfg)
		if err != nil {
			return err
		}
		_, err = iss.Issue(context.Background(), attestation.PurposeVerify, make([]byte, 32))
		iss.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// TestPowerLossNeverBlocksQuotes: a TPM whose power is cut (swtpm killed, no TPM2_Shutdown)
// and restored again and again still quotes with both AKs after every restart, and its
// dictionary-attack counter stays at zero. The same sequence with a DA-protected AK (the
// earlier template) locks the TPM out after MAX_AUTH_FAIL power cuts: that is the failure
// this guards against, reproduced.
func TestPowerLossNeverBlocksQuotes(t *testing.T) {
	ours := []vtpm.IssuerConfig{{Variant: testVariant, AK: vtpm.AKRSA}, {Variant: testVariant, AK: vtpm.AKECC}}
	const cuts = 8 // more than swtpm's MAX_AUTH_FAIL (3)

	t.Run("our AKs", func(t *testing.T) {
		s := newRestartableSwtpm(t)
		for i := range cuts + 1 {
			s.use(func(tpm *vtpm.TPM) {
				require.NoError(t, quoteAll(tpm, ours...), "after %d power cuts", i)
				da, err := tpm.DAState()
				require.NoError(t, err)
				assert.Zero(t, da.FailedTries, "after %d power cuts: nothing DA-protected was used", i)
				assert.False(t, da.LockedOut())
			})
			s.powerCut()
		}
	})

	t.Run("a DA-protected AK locks out", func(t *testing.T) {
		// The AK of the earlier template, at the handle our RSA AK uses now: a TPM as an
		// earlier version left it.
		legacy := []vtpm.IssuerConfig{{Variant: testVariant, LoadAK: client.AttestationKeyRSA}}
		s := newRestartableSwtpm(t)
		var maxTries uint32
		s.use(func(tpm *vtpm.TPM) {
			da, err := tpm.DAState()
			require.NoError(t, err)
			maxTries = da.MaxTries
		})
		require.NotZero(t, maxTries)
		for i := range int(maxTries) {
			s.use(func(tpm *vtpm.TPM) { require.NoError(t, quoteAll(tpm, legacy...), "after %d power cuts", i) })
			s.powerCut()
		}
		s.use(func(tpm *vtpm.TPM) {
			err := quoteAll(tpm, legacy...)
			require.Error(t, err)
			assert.True(t, vtpm.IsLockout(err), "%v", err)
			da, err := tpm.DAState()
			require.NoError(t, err)
			assert.Equal(t, maxTries, da.FailedTries)
			assert.True(t, da.InLockout)
			// Our AKs quote on the very TPM that refuses the DA-protected one: the earlier
			// key at the RSA AK's handle is replaced (owner authorization is not
			// DA-protected), so a node locked out before the upgrade quotes at its next boot.
			assert.NoError(t, quoteAll(tpm, ours...))
		})
	})
}

// TestStopIsAPowerLossToo: swtpm stopped by SIGTERM gets no TPM2_Shutdown either (nor does
// a provider's reboot send one): after a DA-protected object was used, the next start-up
// counts a failure. An orderly TPM2_Shutdown before it does not.
func TestStopIsAPowerLossToo(t *testing.T) {
	s := newRestartableSwtpm(t)
	failedTries := func() uint32 {
		var n uint32
		s.use(func(tpm *vtpm.TPM) {
			da, err := tpm.DAState()
			require.NoError(t, err)
			n = da.FailedTries
		})
		return n
	}
	useLegacy := func() {
		s.use(func(tpm *vtpm.TPM) {
			require.NoError(t, quoteAll(tpm, vtpm.IssuerConfig{Variant: testVariant, LoadAK: vtpmtest.LoadDAProtectedAK}))
		})
	}
	useLegacy()
	require.NoError(t, s.proc.Stop())
	s.start()
	assert.Equal(t, uint32(1), failedTries(), "SIGTERM: no orderly shutdown")

	useLegacy()
	s.use(func(tpm *vtpm.TPM) {
		require.NoError(t, tpm.With(func(rw io.ReadWriter) error { return tpm2.Shutdown(rw, tpm2.StartupClear) }))
	})
	require.NoError(t, s.proc.Stop())
	s.start()
	assert.Equal(t, uint32(1), failedTries(), "TPM2_Shutdown first: an orderly shutdown counts nothing")
}

// TestLockoutIsReported: a TPM in lockout that refuses a DA-protected AK is reported with
// the reason, its DA state and when the lockout clears, and it does clear by then; our AKs
// quote throughout.
func TestLockoutIsReported(t *testing.T) {
	backends(t, func(t *testing.T, tpm *vtpm.TPM) {
		const recovery = 2 * time.Second
		vtpmtest.LockOut(t, tpm, recovery)
		legacy, err := vtpm.NewIssuer(tpm, vtpm.IssuerConfig{Variant: testVariant, LoadAK: vtpmtest.LoadDAProtectedAK})
		require.NoError(t, err)
		t.Cleanup(func() { _ = legacy.Close() })
		now := time.Now()
		f := vtpm.CheckQuote(t.Context(), legacy, tpm, now)
		require.NotNil(t, f, "the DA-protected AK cannot quote")
		assert.True(t, f.Lockout())
		require.NotNil(t, f.DA, "%v", f.DAErr)
		assert.True(t, f.DA.InLockout)
		assert.Equal(t, uint32(2), f.DA.MaxTries)
		assert.Equal(t, recovery, f.DA.RecoveryTime)
		by, ok := f.ClearsBy()
		require.True(t, ok)
		assert.Equal(t, now.Add(time.Duration(f.DA.FailedTries-1)*recovery), by)
		reason := f.Reason()
		assert.Contains(t, reason, "dictionary-attack lockout")
		assert.Contains(t, reason, by.UTC().Format(time.RFC3339))
		assert.Contains(t, reason, "2 of 2 authorization failures")

		ours, err := vtpm.NewIssuer(tpm, vtpm.IssuerConfig{Variant: testVariant})
		require.NoError(t, err)
		t.Cleanup(func() { _ = ours.Close() })
		assert.Nil(t, vtpm.CheckQuote(t.Context(), ours, nil, now), "our AK quotes in lockout")

		// The lockout ends by the time reported (with a second for the TPM's clock).
		require.Eventually(t, func() bool {
			return vtpm.CheckQuote(t.Context(), legacy, nil, time.Now()) == nil
		}, time.Until(by)+time.Second, 100*time.Millisecond, "the lockout clears by %s", by)
	})
}
