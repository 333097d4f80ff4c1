package nitrotpm_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/openconstellation/constellation/pkg/api/attestation/vtpmpb"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/eventlog/eventlogtest"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/measurements/measurementstest"
	"github.com/openconstellation/constellation/pkg/attestation/nitrotpm"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/vtpmtest"
)

var data = bytes.Repeat([]byte{0x42}, 32)

// boot boots tpm with image v1 and returns evidence from the production issuer and the
// reference sets its PCRs match.
func boot(t *testing.T, tpm *vtpm.TPM) ([]byte, measurements.ReferenceSets) {
	log := eventlogtest.Boot(t, tpm, eventlogtest.Image("v1"))
	iss, err := nitrotpm.NewIssuer(tpm, nitrotpm.IssuerConfig{EventLog: func() ([]byte, error) { return log, nil }})
	require.NoError(t, err)
	t.Cleanup(func() { iss.Close() })
	ev, err := iss.Issue(context.Background(), attestation.PurposeVerify, data)
	require.NoError(t, err)
	pcrs, err := tpm.ReadPCRs()
	require.NoError(t, err)
	return ev, measurements.ReferenceSets{{Name: "v1", Measurements: measurementstest.FromRegisters(nitrotpm.Variant, pcrs)}}
}

func TestRefusedWithoutOptIn(t *testing.T) {
	_, err := nitrotpm.NewValidator(nitrotpm.ValidatorConfig{ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: measurements.ReferenceSets{{Name: "zero", Measurements: measurementstest.Image(nitrotpm.Variant, nil)}}}})
	assert.ErrorContains(t, err, "AcceptUnauthenticatedAK")
}

func TestNitroTPM(t *testing.T) {
	ev, sets := boot(t, vtpmtest.Simulator(t))
	v, err := nitrotpm.NewValidator(nitrotpm.ValidatorConfig{ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: sets}, AcceptUnauthenticatedAK: true})
	require.NoError(t, err)

	got, err := v.Validate(context.Background(), ev, attestation.PurposeVerify, data)
	require.NoError(t, err)
	assert.False(t, got.SignerCertified)
	assert.Contains(t, got.Warnings, nitrotpm.UnauthenticatedAKWarning)

	tampered := func(f func(*vtpmpb.Evidence)) []byte {
		e := &vtpmpb.Evidence{}
		require.NoError(t, proto.Unmarshal(ev, e))
		f(e)
		b, err := proto.Marshal(e)
		require.NoError(t, err)
		return b
	}
	testCases := map[string]struct {
		evidence []byte
		purpose  attestation.Purpose
		wantErr  error
		wantMsg  string
	}{
		"no event log":             {evidence: tampered(func(e *vtpmpb.Evidence) { e.EventLog = nil }), wantErr: attestation.ErrMalformed, wantMsg: "no event log"},
		"event log of image v2":    {evidence: tampered(func(e *vtpmpb.Evidence) { e.EventLog = eventlogtest.Boot(t, nowhere{}, eventlogtest.Image("v2")) }), wantErr: attestation.ErrMalformed, wantMsg: "quoted value of PCRs [4 8 9]"},
		"PCR 8 value":              {evidence: tampered(func(e *vtpmpb.Evidence) { e.Pcrs[8][0] ^= 1 }), wantErr: attestation.ErrBadSignature},
		"quote":                    {evidence: tampered(func(e *vtpmpb.Evidence) { e.Quote[len(e.Quote)-1] ^= 1 }), wantErr: attestation.ErrBadSignature},
		"made for another purpose": {evidence: ev, purpose: attestation.PurposeATLSServer, wantErr: attestation.ErrNonceMismatch},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			purpose := attestation.PurposeVerify
			if tc.purpose != (attestation.Purpose{}) {
				purpose = tc.purpose
			}
			_, err := v.Validate(context.Background(), tc.evidence, purpose, data)
			require.ErrorIs(t, err, tc.wantErr)
			assert.ErrorContains(t, err, tc.wantMsg)
		})
	}
}

// TestAnyTPMPasses documents the weakness the warning names: a swtpm on the attacker's own
// machine, booted with the published measurements, produces evidence that validates.
func TestAnyTPMPasses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts swtpm")
	}
	_, sets := boot(t, vtpmtest.Simulator(t))
	attackerTPM, _ := vtpmtest.Swtpm(t)
	forged, _ := boot(t, attackerTPM)
	v, err := nitrotpm.NewValidator(nitrotpm.ValidatorConfig{ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: sets}, AcceptUnauthenticatedAK: true})
	require.NoError(t, err)
	got, err := v.Validate(context.Background(), forged, attestation.PurposeVerify, data)
	require.NoError(t, err, "nothing ties the AK to AWS")
	assert.False(t, got.SignerCertified)
	assert.Equal(t, []string{nitrotpm.UnauthenticatedAKWarning}, got.Warnings)
}

type nowhere struct{}

func (nowhere) ExtendPCR(int, []byte) error { return nil }
