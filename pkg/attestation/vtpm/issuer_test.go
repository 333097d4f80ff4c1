package vtpm_test

import (
	"bytes"
	"crypto/sha256"
	"testing"

	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/openconstellation/constellation/pkg/api/attestation/vtpmpb"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/vtpmtest"
)

// TestIssuerFollowsPCRChanges: the issuer reads PCR values only when a quote's PCR digest
// differs from the values it read last; evidence must still always carry the values the TPM
// just quoted, also after a PCR was extended between two quotes.
func TestIssuerFollowsPCRChanges(t *testing.T) {
	tpm := vtpmtest.Simulator(t)
	iss, err := vtpm.NewIssuer(tpm, vtpm.IssuerConfig{Variant: testVariant})
	require.NoError(t, err)
	t.Cleanup(func() { _ = iss.Close() })

	issue := func() *vtpmpb.Evidence {
		t.Helper()
		raw, err := iss.Issue(t.Context(), attestation.PurposeVerify, make([]byte, 32))
		require.NoError(t, err)
		ev := &vtpmpb.Evidence{}
		require.NoError(t, proto.Unmarshal(raw, ev))
		attested, err := tpm2.DecodeAttestationData(ev.Quote)
		require.NoError(t, err)
		h := sha256.New()
		for _, v := range ev.Pcrs {
			h.Write(v)
		}
		require.Equal(t, []byte(attested.AttestedQuoteInfo.PCRDigest), h.Sum(nil), "the values sent are the values quoted")
		current, err := tpm.ReadPCRs()
		require.NoError(t, err)
		for i, v := range ev.Pcrs {
			require.Equal(t, current[uint32(i)], v, "PCR %d", i)
		}
		return ev
	}
	first := issue()
	assert.Equal(t, first.Pcrs, issue().Pcrs, "nothing extended: same values")
	for round := range 3 {
		digest := sha256.Sum256([]byte{byte(round)})
		require.NoError(t, tpm.ExtendPCR(16, digest[:]))
		ev := issue()
		assert.False(t, bytes.Equal(first.Pcrs[16], ev.Pcrs[16]), "round %d: the extended value is sent", round)
		first = ev
	}
}
