package bootstraptest

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

	"github.com/openconstellation/constellation/api/attestation/vtpmpb"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/qemu"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
)

// SoftwareIssuer issues what an attacker without a TPM can: a TPM2_Quote structure over PCR
// values of its choice, signed by a software RSA key whose public area claims every
// attribute of a TPM-resident restricted AK. Without AK roots a validator cannot tell it from
// a TPM's quote (that is the attack); with roots it has no certificate to show.
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

// NewSoftwareIssuer returns an issuer showing pcrs (missing registers read zero).
func NewSoftwareIssuer(t testing.TB, pcrs map[uint32][]byte) *SoftwareIssuer {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	pub, err := tpm2.Public{
		Type: tpm2.AlgRSA, NameAlg: tpm2.AlgSHA256, Attributes: tpm2.FlagSignerDefault,
		RSAParameters: &tpm2.RSAParams{
			Sign:    &tpm2.SigScheme{Alg: tpm2.AlgRSASSA, Hash: tpm2.AlgSHA256},
			KeyBits: 2048, ExponentRaw: uint32(key.E), ModulusRaw: key.N.Bytes(),
		},
	}.Encode()
	require.NoError(t, err)
	s := &SoftwareIssuer{key: key, akPub: pub, variant: qemu.Variant}
	h := sha256.New()
	for i := uint32(0); i < vtpm.NumPCRs; i++ {
		v := pcrs[i]
		if v == nil {
			v = make([]byte, sha256.Size)
		}
		s.pcrs = append(s.pcrs, v)
		h.Write(v)
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
	for i := 0; i < vtpm.NumPCRs; i++ {
		sel.PCRs = append(sel.PCRs, i)
	}
	quoted, err := tpm2.AttestationData{
		Magic: 0xff544347, Type: tpm2.TagAttestQuote,
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
