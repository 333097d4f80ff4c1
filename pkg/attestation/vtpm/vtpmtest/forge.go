package vtpmtest

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"fmt"
	"testing"

	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/openconstellation/constellation/pkg/api/attestation/vtpmpb"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/eventlog/eventlogtest"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
)

// SoftwareIssuer issues what an attacker without a TPM can: a TPM2_Quote structure over PCR
// values of its choice, signed by a software RSA key whose public area claims every
// attribute of a TPM-resident restricted AK (SoftwareAK). Without AK roots a validator cannot
// tell it from a TPM's quote (that is the attack); with roots it has no certificate to show.
type SoftwareIssuer struct {
	key     *rsa.PrivateKey
	akPub   []byte
	pcrs    [][]byte
	digest  []byte
	variant variant.Variant
	// EventLog is sent with the evidence: a log the attacker forged to match the PCRs it
	// shows, as it can (the log is no more trusted than the quote).
	EventLog []byte
}

// NewSoftwareIssuer returns an issuer of variant v showing pcrs (missing registers read
// zero), signing with key (a fresh RSA-2048 key if nil).
func NewSoftwareIssuer(t testing.TB, v variant.Variant, key *rsa.PrivateKey, pcrs map[uint32][]byte) *SoftwareIssuer {
	t.Helper()
	if key == nil {
		var err error
		key, err = rsa.GenerateKey(rand.Reader, 2048)
		require.NoError(t, err)
	}
	s := &SoftwareIssuer{key: key, akPub: SoftwareAK(t, key), variant: v}
	h := sha256.New()
	for i := range uint32(vtpm.NumPCRs) {
		val := pcrs[i]
		if val == nil {
			val = make([]byte, sha256.Size)
		}
		s.pcrs = append(s.pcrs, val)
		h.Write(val)
	}
	s.digest = h.Sum(nil)
	return s
}

// Variant implements attestation.Issuer.
func (s *SoftwareIssuer) Variant() variant.Variant { return s.variant }

// Issue implements attestation.Issuer: it binds ReportData(purpose, data) like a genuine
// issuer, so everything but the key's origin is right.
func (s *SoftwareIssuer) Issue(_ context.Context, purpose attestation.Purpose, data []byte) ([]byte, error) {
	nonce, err := attestation.ReportData(purpose, data)
	if err != nil {
		return nil, err
	}
	sel := tpm2.PCRSelection{Hash: tpm2.AlgSHA256}
	for i := range vtpm.NumPCRs {
		sel.PCRs = append(sel.PCRs, i)
	}
	quoted, err := tpm2.AttestationData{
		Magic:             0xff544347, // TPM_GENERATED_VALUE: a claim like any other
		Type:              tpm2.TagAttestQuote,
		QualifiedSigner:   tpm2.Name{Digest: &tpm2.HashValue{Alg: tpm2.AlgSHA256, Value: make([]byte, sha256.Size)}},
		ExtraData:         nonce,
		AttestedQuoteInfo: &tpm2.QuoteInfo{PCRSelection: sel, PCRDigest: s.digest},
	}.Encode()
	if err != nil {
		return nil, fmt.Errorf("encoding the forged quote: %w", err)
	}
	h := sha256.Sum256(quoted)
	sig, err := rsa.SignPKCS1v15(rand.Reader, s.key, crypto.SHA256, h[:])
	if err != nil {
		return nil, err
	}
	rawSig, err := tpm2.Signature{Alg: tpm2.AlgRSASSA, RSA: &tpm2.SignatureRSA{HashAlg: tpm2.AlgSHA256, Signature: sig}}.Encode()
	if err != nil {
		return nil, err
	}
	return proto.Marshal(&vtpmpb.Evidence{Variant: s.variant.String(), AkPublic: s.akPub, Quote: quoted, Signature: rawSig, Pcrs: s.pcrs, EventLog: s.EventLog})
}

// SoftwareBoot computes, without a TPM, the SHA-256 PCR values a TPM would hold after boot
// (an image, as eventlogtest.Image) and the genuine event log that records them.
func SoftwareBoot(t testing.TB, boot []eventlogtest.Measurement) (map[uint32][]byte, []byte) {
	t.Helper()
	bank := softwarePCRs{}
	for i := range uint32(vtpm.NumPCRs) {
		bank[i] = make([]byte, sha256.Size)
	}
	log := eventlogtest.Boot(t, bank, boot)
	return bank, log
}

// Forgery is evidence made without any TPM, and what it claims.
type Forgery struct {
	// Evidence is the TPM-quote evidence (vtpmpb.Evidence), marshalled.
	Evidence []byte
	// PCRs are the 24 SHA-256 PCR values it quotes.
	PCRs map[uint32][]byte
	// EventLog is the TCG event log that replays to PCRs.
	EventLog []byte
}

// Forge makes the evidence an attacker without a TPM sends for variant v: the PCR values and
// event log of boot computed in software (SoftwareBoot), quoted over
// attestation.ReportData(purpose, data) and signed by key (SoftwareIssuer). Such evidence
// passes a validator that trusts an AK because the evidence says so; only AK roots (or a
// hardware report naming the AK) tell it apart.
func Forge(t testing.TB, v variant.Variant, key *rsa.PrivateKey, boot []eventlogtest.Measurement, purpose attestation.Purpose, data []byte) Forgery {
	t.Helper()
	pcrs, log := SoftwareBoot(t, boot)
	iss := NewSoftwareIssuer(t, v, key, pcrs)
	iss.EventLog = log
	ev, err := iss.Issue(context.Background(), purpose, data)
	require.NoError(t, err)
	return Forgery{Evidence: ev, PCRs: pcrs, EventLog: log}
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
