package vtpmtest

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"testing"

	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/openconstellation/constellation/api/attestation/vtpmpb"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/eventlog/eventlogtest"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
)

// Forgery is evidence made without any TPM, and what it claims.
type Forgery struct {
	// Evidence is the TPM-quote evidence (vtpmpb.Evidence), marshalled.
	Evidence []byte
	// PCRs are the 24 SHA-256 PCR values it quotes.
	PCRs map[uint32][]byte
	// EventLog is the TCG event log that replays to PCRs.
	EventLog []byte
}

// Forge makes the evidence an attacker without a TPM sends for variant v: PCR values computed
// in software by extending the measurements of boot (an image, as eventlogtest.Image), the
// genuine event log that records them, and a TPM2_Quote over those PCRs and
// attestation.ReportData(purpose, data), signed by key. The AK is key's public part encoded as
// a TPMT_PUBLIC that claims every attribute of a TPM-resident restricted signing key: those
// attributes are claims, nothing in the evidence proves them. Such evidence passes a validator
// that trusts an AK because the evidence says so; only AK roots (or a hardware report naming
// the AK) tell it apart.
func Forge(t testing.TB, v variant.Variant, key *rsa.PrivateKey, boot []eventlogtest.Measurement, purpose attestation.Purpose, data []byte) Forgery {
	t.Helper()
	bank := softwarePCRs{}
	for i := range vtpm.NumPCRs {
		bank[uint32(i)] = make([]byte, sha256.Size)
	}
	log := eventlogtest.Boot(t, bank, boot)

	nonce, err := attestation.ReportData(purpose, data)
	require.NoError(t, err)
	selection := tpm2.PCRSelection{Hash: tpm2.AlgSHA256}
	digest := sha256.New()
	values := make([][]byte, vtpm.NumPCRs)
	for i := range vtpm.NumPCRs {
		selection.PCRs = append(selection.PCRs, i)
		digest.Write(bank[uint32(i)])
		values[i] = bank[uint32(i)]
	}
	quoted, err := tpm2.AttestationData{
		Magic:             0xff544347, // TPM_GENERATED_VALUE: a claim like any other
		Type:              tpm2.TagAttestQuote,
		ExtraData:         nonce,
		AttestedQuoteInfo: &tpm2.QuoteInfo{PCRSelection: selection, PCRDigest: digest.Sum(nil)},
	}.Encode()
	require.NoError(t, err)
	h := sha256.Sum256(quoted)
	sig, err := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, h[:])
	require.NoError(t, err)
	rawSig, err := tpm2.Signature{Alg: tpm2.AlgRSASSA, RSA: &tpm2.SignatureRSA{HashAlg: tpm2.AlgSHA256, Signature: sig}}.Encode()
	require.NoError(t, err)

	ev, err := proto.Marshal(&vtpmpb.Evidence{
		Variant: v.String(), AkPublic: SoftwareAK(t, key), Quote: quoted, Signature: rawSig, Pcrs: values, EventLog: log,
	})
	require.NoError(t, err)
	return Forgery{Evidence: ev, PCRs: bank, EventLog: log}
}

// SoftwareAK encodes key as a TPMT_PUBLIC that claims every attribute of a TPM-resident AK
// (fixedTPM, fixedParent, sensitiveDataOrigin, restricted, sign).
func SoftwareAK(t testing.TB, key *rsa.PrivateKey) []byte {
	t.Helper()
	pub := tpm2.Public{
		Type:       tpm2.AlgRSA,
		NameAlg:    tpm2.AlgSHA256,
		Attributes: tpm2.FlagSignerDefault,
		RSAParameters: &tpm2.RSAParams{
			Sign:        &tpm2.SigScheme{Alg: tpm2.AlgRSASSA, Hash: tpm2.AlgSHA256},
			KeyBits:     uint16(key.N.BitLen()),
			ExponentRaw: uint32(key.E),
			ModulusRaw:  key.N.Bytes(),
		},
	}
	b, err := pub.Encode()
	require.NoError(t, err)
	return b
}

// softwarePCRs is a SHA-256 PCR bank in memory: extending is hashing.
type softwarePCRs map[uint32][]byte

func (b softwarePCRs) ExtendPCR(idx int, digest []byte) error {
	h := sha256.New()
	h.Write(b[uint32(idx)])
	h.Write(digest)
	b[uint32(idx)] = h.Sum(nil)
	return nil
}
