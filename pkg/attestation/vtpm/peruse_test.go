package vtpm_test

import (
	"context"
	"crypto/rand"
	"github.com/openconstellation/constellation/pkg/attestation"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/measurements/measurementstest"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/vtpmtest"
)

// The per-use issuer holds no connection to swtpm (which serves one at a time) between uses,
// serializes its own uses, and gives up when its caller's context ends while another process
// holds the TPM.
func TestPerUseIssuer(t *testing.T) {
	proc := vtpmtest.SwtpmProcess(t)
	ctx := context.Background()
	for _, alg := range vtpm.AKAlgorithms {
		t.Run(alg.String(), func(t *testing.T) {
			iss, err := vtpm.NewPerUseIssuer(ctx, vtpm.OpenAddr(proc.Addr()), vtpm.IssuerConfig{Variant: variant.QEMUVTPM, AK: alg})
			require.NoError(t, err)
			assert.Equal(t, variant.QEMUVTPM, iss.Variant())
			assert.NotEmpty(t, iss.AKPublic())

			// The TPM is free after construction and after every use: another user gets it.
			free := func() {
				t.Helper()
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				other, err := proc.Open(cctx)
				require.NoError(t, err, "the issuer must not hold the TPM between uses")
				require.NoError(t, other.Close())
			}
			free()

			// Concurrent uses are serialized and all succeed; every evidence validates.
			val, err := vtpm.NewValidator(vtpm.ValidatorConfig{ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: measurements.ReferenceSets{{Name: "fresh", Measurements: measurementstest.Image(variant.QEMUVTPM, nil)}}}, Variant: variant.QEMUVTPM, AcceptUnauthenticatedAK: true})
			require.NoError(t, err)
			var wg sync.WaitGroup
			errs := make([]error, 6)
			for i := range errs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					nonce := make([]byte, 32)
					_, _ = rand.Read(nonce)
					ev, err := iss.Issue(ctx, attestation.PurposeVerify, nonce)
					if err == nil {
						_, err = val.Validate(ctx, ev, attestation.PurposeVerify, nonce)
					}
					errs[i] = err
				}()
			}
			wg.Wait()
			for _, err := range errs {
				assert.NoError(t, err)
			}
			free()
		})
	}
}

func TestPerUseIssuerBusyTPM(t *testing.T) {
	proc := vtpmtest.SwtpmProcess(t)
	ctx := context.Background()
	iss, err := vtpm.NewPerUseIssuer(ctx, vtpm.OpenAddr(proc.Addr()), vtpm.IssuerConfig{Variant: variant.QEMUVTPM})
	require.NoError(t, err)

	// Another process holds the TPM: the issue gives up when its context ends.
	holder, err := proc.Open(ctx)
	require.NoError(t, err)
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = iss.Issue(cctx, attestation.PurposeVerify, make([]byte, 32))
	require.Error(t, err)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), 5*time.Second, "gave up with the context, not after the TPM command timeout")

	// Released, the TPM serves the issuer again.
	require.NoError(t, holder.Close())
	_, err = iss.Issue(ctx, attestation.PurposeVerify, make([]byte, 32))
	assert.NoError(t, err)

	// A caller whose context has ended gets an error, not evidence.
	_, err = iss.Issue(canceled(), attestation.PurposeVerify, make([]byte, 32))
	assert.ErrorIs(t, err, context.Canceled)

	// No TPM at all: construction fails and names the address.
	_, err = vtpm.NewPerUseIssuer(ctx, vtpm.OpenAddr("unix:/nonexistent/tpm.sock"), vtpm.IssuerConfig{Variant: variant.QEMUVTPM})
	assert.ErrorContains(t, err, "unix:/nonexistent/tpm.sock")
}

func canceled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// PerUseTPM reads and extends PCRs of a real swtpm and leaves the TPM free after every call.
func TestPerUseTPM(t *testing.T) {
	proc := vtpmtest.SwtpmProcess(t)
	p := vtpm.PerUseTPM{Open: vtpm.OpenAddr(proc.Addr())}
	before, err := p.ReadPCRs(15)
	require.NoError(t, err)
	assert.Equal(t, make([]byte, 32), before[15])

	digest := make([]byte, 32)
	digest[0] = 1
	require.NoError(t, p.ExtendPCR(15, digest))
	after, err := p.ReadPCRs(15)
	require.NoError(t, err)
	assert.NotEqual(t, before[15], after[15], "the extension reached the TPM")

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	other, err := proc.Open(ctx)
	require.NoError(t, err, "PerUseTPM must not hold the TPM between calls")
	again, err := other.ReadPCRs(15)
	require.NoError(t, err)
	assert.Equal(t, after[15], again[15])
	require.NoError(t, other.Close())

	assert.ErrorContains(t, p.ExtendPCR(15, []byte{1}), "digest has 1 bytes")
}
