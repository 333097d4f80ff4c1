package azuretdx

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"errors"
	"fmt"
	"testing"

	tdxpb "github.com/google/go-tdx-guest/proto/tdx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/pkg/api/attestation/hardwarepb"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/azure"
	"github.com/openconstellation/constellation/pkg/attestation/tdx"
)

// TestCollateralVerdictComesLast: when Intel's collateral refuses the quote, or is not at
// hand under the default policy (what tdx.VerifyQuote keeps in the quote for Claims), the
// check still names what is wrong with the evidence itself first: a TPM quote signed by
// another AK than the runtime data's, a TD quote of another TDREPORT, a quote outside the
// reference. Only evidence that passes all of them gets the collateral's verdict. (No test
// can make an Intel-signed quote of a chosen TDREPORT, so the quote is the fake one, and the
// collateral's verdict stands in for tdx.VerifyQuote's; TestOfflineVerdictsOfEditedHCLReport
// runs the real ones.)
func TestCollateralVerdictComesLast(t *testing.T) {
	raw, err := azureSample()
	require.NoError(t, err)
	hcl, err := azure.ParseHCLReport(raw)
	require.NoError(t, err)
	rd, err := azure.ParseRuntimeData(hcl.RuntimeData)
	require.NoError(t, err)
	quote, err := (&fakeIntel{}).Quote(context.Background(), hcl.HardwareReport)
	require.NoError(t, err)
	otherQuote, err := (&fakeIntel{edit: func(b *tdxpb.TDQuoteBody) { b.MrTd[0] ^= 1 }}).Quote(context.Background(), hcl.HardwareReport)
	require.NoError(t, err)
	other, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)

	for name, verdict := range map[string]error{
		"revocation unknown": fmt.Errorf("TD quote: Intel's collateral: offline: %w", attestation.ErrRevocationUnknown),
		"revoked":            fmt.Errorf("TD quote: Intel's collateral refuses it: revoked: %w", attestation.ErrUntrustedSigner),
	} {
		t.Run(name, func(t *testing.T) {
			check := func(policyPasses bool) *HardwareCheck {
				c := testCheck(t)
				if !policyPasses {
					c.validateQuote = func(*tdx.Quote) error { return fmt.Errorf("MRSEAM: %w", attestation.ErrMeasurementPolicy) }
				}
				c.claims = func(*tdx.Quote) (*attestation.Hardware, error) {
					return nil, &attestation.CollateralError{Err: verdict}
				}
				return c
			}
			for name, tc := range map[string]struct {
				quote        []byte
				ak           *rsa.PublicKey
				policyPasses bool
				want         error
				msg          string
			}{
				"TPM quote signed by another AK": {quote: quote, ak: &other.PublicKey, policyPasses: true, want: attestation.ErrUntrustedSigner, msg: "HCLAkPub"},
				"TD quote of another TDREPORT":   {quote: otherQuote, ak: rd.AK, policyPasses: true, want: attestation.ErrBadSignature, msg: "MRTD"},
				"outside the reference":          {quote: quote, ak: rd.AK, want: attestation.ErrMeasurementPolicy, msg: "MRSEAM"},
				"nothing else wrong":             {quote: quote, ak: rd.AK, policyPasses: true, want: errors.Unwrap(verdict)},
			} {
				t.Run(name, func(t *testing.T) {
					_, err := check(tc.policyPasses).Check(context.Background(), &hardwarepb.Hardware{HclReport: raw, TdQuote: tc.quote}, tc.ak, nil, nil)
					require.ErrorIs(t, err, tc.want)
					assert.Equal(t, attestation.Reason(tc.want), attestation.Reason(err))
					_, isCollateral := errors.AsType[*attestation.CollateralError](err)
					assert.Equal(t, tc.msg == "", isCollateral, "only the last verdict is the collateral's: %v", err)
					if tc.msg != "" {
						assert.ErrorContains(t, err, tc.msg)
					}
				})
			}
		})
	}
}
