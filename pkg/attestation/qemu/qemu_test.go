package qemu_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/google/go-eventlog/tcg"
	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/openconstellation/constellation/pkg/api/attestation/vtpmpb"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/eventlog/eventlogtest"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/measurements/measurementstest"
	"github.com/openconstellation/constellation/pkg/attestation/qemu"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/vtpmtest"
)

var (
	nonce      = bytes.Repeat([]byte{0x11}, 32)
	otherNonce = bytes.Repeat([]byte{0x22}, 32)
	testNow    = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
)

// image is the boot the tests' nodes measure: the components a provider extends, recorded in
// the event log qemu-vtpm evidence must carry.
func image() []eventlogtest.Measurement {
	return []eventlogtest.Measurement{
		{PCR: 4, Type: tcg.Ipl, Data: []byte("bootstrapper")},
		{PCR: 9, Type: tcg.Ipl, Data: []byte("kubelet")},
		{PCR: 11, Type: tcg.Ipl, Data: []byte("node-config")},
	}
}

// bootNode extends the PCRs a provider would measure and returns the reference set that the
// node's current PCR values satisfy (PCRs 0-14 enforced) and the event log of the boot.
func bootNode(t testing.TB, tpm *vtpm.TPM) (measurements.M, func() ([]byte, error)) {
	t.Helper()
	log := eventlogtest.Boot(t, tpm, image())
	pcrs, err := tpm.ReadPCRs()
	require.NoError(t, err)
	return measurementstest.FromRegisters(qemu.Variant, pcrs), func() ([]byte, error) { return log, nil }
}

// bootAndIssue boots a node on tpm and returns its reference values, its issuer and one
// genuine evidence over nonce.
func bootAndIssue(t testing.TB, tpm *vtpm.TPM) (measurements.M, *vtpm.Issuer, []byte) {
	t.Helper()
	ref, log := bootNode(t, tpm)
	iss, err := qemu.NewIssuer(tpm, nil, log)
	require.NoError(t, err)
	ev, err := iss.Issue(context.Background(), attestation.PurposeVerify, nonce)
	require.NoError(t, err)
	return ref, iss, ev
}

func decode(t testing.TB, ev []byte) *vtpmpb.Evidence {
	t.Helper()
	out := &vtpmpb.Evidence{}
	require.NoError(t, proto.Unmarshal(ev, out))
	return out
}

func encode(t *testing.T, ev *vtpmpb.Evidence) []byte {
	t.Helper()
	b, err := proto.Marshal(ev)
	require.NoError(t, err)
	return b
}

func flip(b []byte, i int) []byte {
	out := bytes.Clone(b)
	out[i%len(out)] ^= 0x01
	return out
}

func TestRoundTrip(t *testing.T) {
	for name, open := range map[string]func(t *testing.T) *vtpm.TPM{
		"simulator": func(t *testing.T) *vtpm.TPM { return vtpmtest.Simulator(t) },
		"swtpm":     func(t *testing.T) *vtpm.TPM { tpm, _ := vtpmtest.Swtpm(t); return tpm },
	} {
		t.Run(name, func(t *testing.T) {
			tpm := open(t)
			ref, log := bootNode(t, tpm)
			ca, err := vtpmtest.NewPlatformCA("test AK CA")
			require.NoError(t, err)
			iss, err := qemu.NewIssuer(tpm, nil, log)
			require.NoError(t, err)
			cert, err := ca.CertifyNodeAK(iss.AKPublic(), "worker-0", attestation.RoleWorker, testNow, time.Hour)
			require.NoError(t, err)
			require.NoError(t, tpm.WriteNV(vtpm.AKCertNVIndex, cert))
			iss, err = qemu.NewIssuer(tpm, nil, log)
			require.NoError(t, err)
			val, err := qemu.NewValidator(qemu.ValidatorConfig{
				ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: measurements.ReferenceSets{{Name: "image-v1", Measurements: ref}}, Now: func() time.Time { return testNow }},
				AKRoots:         ca.Pool(),
			})
			require.NoError(t, err)

			ev, err := iss.Issue(context.Background(), attestation.PurposeVerify, nonce)
			require.NoError(t, err)
			wantLog, err := log()
			require.NoError(t, err)
			assert.Equal(t, wantLog, decode(t, ev).EventLog)

			got, err := val.Validate(context.Background(), ev, attestation.PurposeVerify, nonce)
			require.NoError(t, err)
			assert.Equal(t, variant.QEMUVTPM, got.Variant)
			assert.Equal(t, "image-v1", got.ReferenceSet)
			assert.Len(t, got.Registers, vtpm.NumPCRs)
			assert.Equal(t, ref[4].Expected, got.Registers[4])
			assert.True(t, got.SignerCertified)
			assert.Equal(t, "worker-0", got.SignerName)
			assert.Empty(t, got.Warnings)
			assert.Equal(t, vtpmtest.AKID(t, iss.AKPublic()), got.SignerID)
		})
	}
}

// TestValidateReportData: a relying party with its own binding scheme (here: the bytes it
// chose, bound as a quote's qualifying data) checks the evidence with ValidateReportData;
// all other checks are Validate's, and a mismatch is a nonce mismatch.
func TestValidateReportData(t *testing.T) {
	tpm := vtpmtest.Simulator(t)
	ref, iss, _ := bootAndIssue(t, tpm)
	val, err := qemu.NewValidator(qemu.ValidatorConfig{ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: measurements.ReferenceSets{{Name: "image-v1", Measurements: ref}}}, AcceptUnauthenticatedAK: true})
	require.NoError(t, err)
	rd, err := attestation.ReportData(attestation.PurposeVerify, nonce)
	require.NoError(t, err)
	ev, err := iss.Issue(context.Background(), attestation.PurposeVerify, nonce)
	require.NoError(t, err)

	got, err := attestation.ValidateReportData(context.Background(), val, ev, rd)
	require.NoError(t, err)
	assert.Equal(t, "image-v1", got.ReferenceSet)
	for name, bad := range map[string][]byte{"other": bytes.Repeat([]byte{1}, 32), "empty": nil, "too long": make([]byte, 65)} {
		_, err := val.ValidateReportData(context.Background(), ev, bad)
		assert.ErrorIs(t, err, attestation.ErrNonceMismatch, name)
	}
}

// TestRejections covers every way evidence must fail, against one genuine evidence.
func TestRejections(t *testing.T) {
	tpm := vtpmtest.Simulator(t)
	ref, iss, ev := bootAndIssue(t, tpm)

	// Evidence of another TPM variant from the same TPM.
	otherIss, err := vtpm.NewIssuer(tpm, vtpm.IssuerConfig{Variant: variant.AWSNitroTPM})
	require.NoError(t, err)
	otherVariant, err := otherIss.Issue(context.Background(), attestation.PurposeVerify, nonce)
	require.NoError(t, err)

	// The same node's evidence over the same nonce, for another purpose (one key, one
	// meaning: evidence of the attested channel is not an answer of the verification service).
	otherPurpose, err := iss.Issue(context.Background(), attestation.PurposeATLSClient, nonce)
	require.NoError(t, err)
	reportData := func(n []byte) []byte {
		rd, err := attestation.ReportData(attestation.PurposeVerify, n)
		require.NoError(t, err)
		return rd
	}

	sets := measurements.ReferenceSets{{Name: "image-v1", Measurements: ref}}
	val, err := qemu.NewValidator(qemu.ValidatorConfig{ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: sets, MaxEvidenceSize: 8 << 10}, AcceptUnauthenticatedAK: true})
	require.NoError(t, err)

	testCases := map[string]struct {
		evidence []byte
		nonce    []byte
		wantErr  error
		wantMsg  string
	}{
		"wrong nonce": {evidence: ev, nonce: otherNonce, wantErr: attestation.ErrNonceMismatch},
		"tampered quote": {
			evidence: mutate(t, ev, func(e *vtpmpb.Evidence) { e.Quote = flip(e.Quote, len(e.Quote)-3) }),
			nonce:    nonce, wantErr: attestation.ErrBadSignature,
		},
		"evidence for another purpose": {evidence: otherPurpose, nonce: nonce, wantErr: attestation.ErrNonceMismatch, wantMsg: "another purpose"},
		"tampered nonce inside quote": {
			evidence: mutate(t, ev, func(e *vtpmpb.Evidence) {
				e.Quote = bytes.Replace(e.Quote, reportData(nonce), reportData(otherNonce), 1)
			}),
			nonce: otherNonce, wantErr: attestation.ErrBadSignature,
		},
		"tampered signature": {
			evidence: mutate(t, ev, func(e *vtpmpb.Evidence) { e.Signature = flip(e.Signature, 40) }),
			nonce:    nonce, wantErr: attestation.ErrBadSignature,
		},
		"tampered PCR value": {
			evidence: mutate(t, ev, func(e *vtpmpb.Evidence) { e.Pcrs[4] = flip(e.Pcrs[4], 0) }),
			nonce:    nonce, wantErr: attestation.ErrBadSignature, wantMsg: "PCR",
		},
		"tampered PCR value and another nonce (the PCRs are named, not the nonce)": {
			evidence: mutate(t, ev, func(e *vtpmpb.Evidence) { e.Pcrs[4] = flip(e.Pcrs[4], 0) }),
			nonce:    otherNonce, wantErr: attestation.ErrBadSignature, wantMsg: "PCR",
		},
		"PCR removed from evidence": {
			evidence: mutate(t, ev, func(e *vtpmpb.Evidence) { e.Pcrs = e.Pcrs[:23] }),
			nonce:    nonce, wantErr: attestation.ErrMalformed, wantMsg: "23 PCR values, want 24",
		},
		"PCRs swapped": {
			evidence: mutate(t, ev, func(e *vtpmpb.Evidence) { e.Pcrs[4], e.Pcrs[0] = e.Pcrs[0], e.Pcrs[4] }),
			nonce:    nonce, wantErr: attestation.ErrBadSignature,
		},
		"AK replaced": {
			evidence: mutate(t, ev, func(e *vtpmpb.Evidence) { e.AkPublic = vtpmtest.SoftwareAK(t, mustRSAKey(t)) }),
			nonce:    nonce, wantErr: attestation.ErrBadSignature,
		},
		"unrestricted AK": {
			evidence: mutate(t, ev, func(e *vtpmpb.Evidence) {
				pub, err := tpm2.DecodePublic(e.AkPublic)
				require.NoError(t, err)
				pub.Attributes &^= tpm2.FlagRestricted
				e.AkPublic, err = pub.Encode()
				require.NoError(t, err)
			}),
			nonce: nonce, wantErr: attestation.ErrUntrustedSigner, wantMsg: "not a TPM-resident restricted signing key",
		},
		// The AK's own key restated in another public area: the quote's signature still
		// verifies, so only the area's checks stand between these and a pass.
		"AK area restating the scheme's hash": {
			evidence: restateAK(t, ev, func(p *tpm2.Public) { p.RSAParameters.Sign.Hash = 0x00ec }),
			nonce:    nonce, wantErr: attestation.ErrUntrustedSigner, wantMsg: "AK signing scheme",
		},
		"AK area restating the key size": {
			evidence: restateAK(t, ev, func(p *tpm2.Public) { p.RSAParameters.KeyBits = 1792 }),
			nonce:    nonce, wantErr: attestation.ErrUntrustedSigner, wantMsg: "states 1792 bits, its modulus has 2048",
		},
		"AK area with a symmetric scheme": {
			evidence: restateAK(t, ev, func(p *tpm2.Public) {
				p.RSAParameters.Symmetric = &tpm2.SymScheme{Alg: tpm2.AlgAES, KeyBits: 128, Mode: tpm2.AlgCFB}
			}),
			nonce: nonce, wantErr: attestation.ErrUntrustedSigner, wantMsg: "symmetric scheme",
		},
		"AK area with an unknown name algorithm": {
			evidence: restateAK(t, ev, func(p *tpm2.Public) { p.NameAlg = 0x00ec }),
			nonce:    nonce, wantErr: attestation.ErrUntrustedSigner, wantMsg: "name algorithm",
		},
		"AK area with trailing bytes": {
			evidence: mutate(t, ev, func(e *vtpmpb.Evidence) { e.AkPublic = append(e.AkPublic, 0) }),
			nonce:    nonce, wantErr: attestation.ErrMalformed, wantMsg: "not in its canonical",
		},
		"other variant":  {evidence: otherVariant, nonce: nonce, wantErr: attestation.ErrWrongVariant, wantMsg: `got "aws-nitro-tpm", want "qemu-vtpm"`},
		"oversized":      {evidence: append(bytes.Clone(ev), make([]byte, 8<<10)...), nonce: nonce, wantErr: attestation.ErrTooLarge},
		"truncated":      {evidence: ev[:len(ev)/2], nonce: nonce, wantErr: attestation.ErrMalformed},
		"garbage":        {evidence: []byte("\xff\xfe not a protobuf"), nonce: nonce, wantErr: attestation.ErrMalformed},
		"empty":          {evidence: nil, nonce: nonce, wantErr: attestation.ErrMalformed, wantMsg: "no evidence"},
		"no quote":       {evidence: mutate(t, ev, func(e *vtpmpb.Evidence) { e.Quote = nil }), nonce: nonce, wantErr: attestation.ErrMalformed, wantMsg: "quote missing"},
		"25 PCRs":        {evidence: mutate(t, ev, func(e *vtpmpb.Evidence) { e.Pcrs = append(e.Pcrs, e.Pcrs[0]) }), nonce: nonce, wantErr: attestation.ErrMalformed},
		"short PCR":      {evidence: mutate(t, ev, func(e *vtpmpb.Evidence) { e.Pcrs[3] = e.Pcrs[3][:20] }), nonce: nonce, wantErr: attestation.ErrMalformed},
		"AK not decoded": {evidence: mutate(t, ev, func(e *vtpmpb.Evidence) { e.AkPublic = e.AkPublic[:10] }), nonce: nonce, wantErr: attestation.ErrMalformed},
		"no event log":   {evidence: mutate(t, ev, func(e *vtpmpb.Evidence) { e.EventLog = nil }), nonce: nonce, wantErr: attestation.ErrMalformed, wantMsg: "no event log"},
		"event log of another boot": {
			evidence: mutate(t, ev, func(e *vtpmpb.Evidence) {
				e.EventLog = eventlogtest.Boot(t, nowhere{}, []eventlogtest.Measurement{{PCR: 4, Type: tcg.Ipl, Data: []byte("other bootstrapper")}})
			}),
			nonce: nonce, wantErr: attestation.ErrMalformed, wantMsg: "quoted value of PCR 4",
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			got, err := val.Validate(context.Background(), tc.evidence, attestation.PurposeVerify, tc.nonce)
			require.ErrorIs(t, err, tc.wantErr)
			assert.Nil(t, got, "no verified data on failure")
			if tc.wantMsg != "" {
				assert.ErrorContains(t, err, tc.wantMsg)
			}
		})
	}
}

func mutate(t *testing.T, ev []byte, fn func(*vtpmpb.Evidence)) []byte {
	t.Helper()
	e := decode(t, ev)
	fn(e)
	return encode(t, e)
}

// restateAK returns ev with its AK's public area changed by fn and encoded again.
func restateAK(t *testing.T, ev []byte, fn func(*tpm2.Public)) []byte {
	t.Helper()
	return mutate(t, ev, func(e *vtpmpb.Evidence) {
		pub, err := tpm2.DecodePublic(e.AkPublic)
		require.NoError(t, err)
		fn(&pub)
		e.AkPublic, err = pub.Encode()
		require.NoError(t, err)
	})
}

// TestSignerIDNamesTheKey: an AK's public area may restate what the checks do not require
// (an explicit default exponent, another policy), and such evidence passes, signed as it is
// by the AK; the signer's ID is the key's, so restating cannot make one node look like two.
func TestSignerIDNamesTheKey(t *testing.T) {
	tpm := vtpmtest.Simulator(t)
	ref, _, ev := bootAndIssue(t, tpm)
	val, err := qemu.NewValidator(qemu.ValidatorConfig{ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: measurements.ReferenceSets{{Name: "v1", Measurements: ref}}}, AcceptUnauthenticatedAK: true})
	require.NoError(t, err)
	want, err := val.Validate(context.Background(), ev, attestation.PurposeVerify, nonce)
	require.NoError(t, err)
	for name, fn := range map[string]func(*tpm2.Public){
		"explicit exponent": func(p *tpm2.Public) { p.RSAParameters.ExponentRaw = 65537 },
		"auth policy":       func(p *tpm2.Public) { p.AuthPolicy = bytes.Repeat([]byte{1}, 32) },
	} {
		t.Run(name, func(t *testing.T) {
			restated := restateAK(t, ev, fn)
			require.NotEqual(t, decode(t, ev).AkPublic, decode(t, restated).AkPublic)
			got, err := val.Validate(context.Background(), restated, attestation.PurposeVerify, nonce)
			require.NoError(t, err)
			assert.Equal(t, want.SignerID, got.SignerID)
		})
	}
}

func mustRSAKey(t *testing.T) *rsa.PrivateKey {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	return k
}

// forge builds evidence with the PCR values an attacker wants, signed by a software key.
func forge(t *testing.T, genuine []byte, key *rsa.PrivateKey, certDER []byte) []byte {
	t.Helper()
	e := decode(t, genuine)
	att, err := tpm2.DecodeAttestationData(e.Quote)
	require.NoError(t, err)
	quoted, err := att.Encode()
	require.NoError(t, err)
	h := sha256.Sum256(quoted)
	sig, err := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, h[:])
	require.NoError(t, err)
	rawSig, err := tpm2.Signature{Alg: tpm2.AlgRSASSA, RSA: &tpm2.SignatureRSA{HashAlg: tpm2.AlgSHA256, Signature: sig}}.Encode()
	require.NoError(t, err)
	e.AkPublic, e.Quote, e.Signature, e.AkCert = vtpmtest.SoftwareAK(t, key), quoted, rawSig, certDER
	return encode(t, e)
}

// TestAKCertificate: with AK roots configured, an AK is trusted only through a certificate
// from those roots; without, a forged quote from a software key passes, which is exactly why
// the local provider certifies AKs and why a validator without roots needs the opt-in.
func TestAKCertificate(t *testing.T) {
	tpm := vtpmtest.Simulator(t)
	ref, log := bootNode(t, tpm)
	sets := measurements.ReferenceSets{{Name: "image-v1", Measurements: ref}}

	ca, err := vtpmtest.NewPlatformCA("test AK CA")
	require.NoError(t, err)
	otherCA, err := vtpmtest.NewPlatformCA("someone else")
	require.NoError(t, err)

	uncertified, err := qemu.NewIssuer(tpm, nil, log)
	require.NoError(t, err)
	akPub := uncertified.AKPublic()
	genuineNoCert, err := uncertified.Issue(context.Background(), attestation.PurposeVerify, nonce)
	require.NoError(t, err)

	goodCert, err := ca.CertifyNodeAK(akPub, "node-0", attestation.RoleWorker, testNow, time.Hour)
	require.NoError(t, err)
	require.NoError(t, tpm.WriteNV(vtpm.AKCertNVIndex, goodCert), "the provider stores the AK certificate in NV")
	certified, err := qemu.NewIssuer(tpm, nil, log)
	require.NoError(t, err, "issuer picks the certificate up from NV")
	genuine, err := certified.Issue(context.Background(), attestation.PurposeVerify, nonce)
	require.NoError(t, err)
	require.Equal(t, goodCert, decode(t, genuine).AkCert)

	foreignCert, err := otherCA.CertifyNodeAK(akPub, "node-0", attestation.RoleWorker, testNow, time.Hour)
	require.NoError(t, err)
	attacker := mustRSAKey(t)
	attackerCert, err := otherCA.CertifyNodeAK(vtpmtest.SoftwareAK(t, attacker), "evil", attestation.RoleControlPlane, testNow, time.Hour)
	require.NoError(t, err)

	_, err = qemu.NewIssuer(tpm, attackerCert, log)
	assert.ErrorContains(t, err, "certificate does not match key", "issuer refuses a certificate for another key")
	_, err = ca.CertifyNodeAK(mutate(t, genuine, func(*vtpmpb.Evidence) {})[:0], "x", attestation.RoleWorker, testNow, time.Hour)
	assert.Error(t, err)

	withRoots := func(now time.Time) *vtpm.Validator {
		v, err := qemu.NewValidator(qemu.ValidatorConfig{ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: sets, Now: func() time.Time { return now }}, AKRoots: ca.Pool()})
		require.NoError(t, err)
		return v
	}
	noRoots, err := qemu.NewValidator(qemu.ValidatorConfig{ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: sets}, AcceptUnauthenticatedAK: true})
	require.NoError(t, err)

	t.Run("certified AK accepted", func(t *testing.T) {
		v := withRoots(testNow)
		for range 2 { // second run takes the certificate cache path
			got, err := v.Validate(context.Background(), genuine, attestation.PurposeVerify, nonce)
			require.NoError(t, err)
			assert.True(t, got.SignerCertified)
			assert.Equal(t, "node-0", got.SignerName, "the certified name of the node")
		}
	})
	t.Run("forged quote passes without roots, with the warning", func(t *testing.T) {
		got, err := noRoots.Validate(context.Background(), forge(t, genuine, attacker, nil), attestation.PurposeVerify, nonce)
		require.NoError(t, err)
		assert.False(t, got.SignerCertified)
		assert.Equal(t, []string{vtpm.UnauthenticatedAKWarning}, got.Warnings)
	})
	rejected := map[string]struct {
		evidence []byte
		now      time.Time
		wantMsg  string
	}{
		"no certificate":              {evidence: genuineNoCert, now: testNow, wantMsg: "no AK certificate"},
		"certificate of another CA":   {evidence: mutate(t, genuine, func(e *vtpmpb.Evidence) { e.AkCert = foreignCert }), now: testNow, wantMsg: "unknown authority"},
		"forged, self-made cert":      {evidence: forge(t, genuine, attacker, attackerCert), now: testNow, wantMsg: "unknown authority"},
		"forged, genuine node's cert": {evidence: forge(t, genuine, attacker, goodCert), now: testNow, wantMsg: "another key"},
		"expired certificate":         {evidence: genuine, now: testNow.Add(2 * time.Hour), wantMsg: "expired"},
		"garbage certificate":         {evidence: mutate(t, genuine, func(e *vtpmpb.Evidence) { e.AkCert = []byte("junk") }), now: testNow, wantMsg: "AK certificate"},
	}
	for name, tc := range rejected {
		t.Run(name, func(t *testing.T) {
			_, err := withRoots(tc.now).Validate(context.Background(), tc.evidence, attestation.PurposeVerify, nonce)
			require.ErrorIs(t, err, attestation.ErrUntrustedSigner)
			assert.ErrorContains(t, err, tc.wantMsg)
		})
	}
	t.Run("expiry is checked on cache hits", func(t *testing.T) {
		now := testNow
		v, err := qemu.NewValidator(qemu.ValidatorConfig{ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: sets, Now: func() time.Time { return now }}, AKRoots: ca.Pool()})
		require.NoError(t, err)
		_, err = v.Validate(context.Background(), genuine, attestation.PurposeVerify, nonce)
		require.NoError(t, err)
		now = testNow.Add(2 * time.Hour)
		_, err = v.Validate(context.Background(), genuine, attestation.PurposeVerify, nonce)
		require.ErrorIs(t, err, attestation.ErrUntrustedSigner)
	})
}

func TestPolicy(t *testing.T) {
	tpm := vtpmtest.Simulator(t)
	ref, _, ev := bootAndIssue(t, tpm)

	wrong := bytes.Repeat([]byte{0xab}, 32)
	with := func(changes map[uint32]measurements.Measurement) measurements.M {
		m := measurements.M{}
		for k, v := range ref {
			m[k] = v
		}
		for k, v := range changes {
			m[k] = v
		}
		return m
	}
	testCases := map[string]struct {
		sets         measurements.ReferenceSets
		wantSet      string
		wantWarnings []string
		wantErrMsgs  []string
	}{
		"enforced mismatch names every register": {
			sets:        measurements.ReferenceSets{{Name: "v1", Measurements: with(map[uint32]measurements.Measurement{4: {Expected: wrong}, 9: {Expected: wrong}})}},
			wantErrMsgs: []string{`closest is "v1" with 2 mismatching register(s)`, "PCR 4: expected abab", "PCR 9: expected abab", "got " + hex.EncodeToString(ref[4].Expected)},
		},
		"second set matches during an upgrade": {
			sets: measurements.ReferenceSets{
				{Name: "v1", Measurements: with(map[uint32]measurements.Measurement{4: {Expected: wrong}})},
				{Name: "v2", Measurements: ref},
			},
			wantSet: "v2",
		},
		"closest of several sets reported": {
			sets: measurements.ReferenceSets{
				{Name: "far", Measurements: with(map[uint32]measurements.Measurement{4: {Expected: wrong}, 9: {Expected: wrong}, 11: {Expected: wrong}})},
				{Name: "near", Measurements: with(map[uint32]measurements.Measurement{11: {Expected: wrong}})},
			},
			wantErrMsgs: []string{"none of 2 reference set(s)", `closest is "near" with 1 mismatching`, "PCR 11: expected"},
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			val, err := qemu.NewValidator(qemu.ValidatorConfig{ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: tc.sets}, AcceptUnauthenticatedAK: true})
			require.NoError(t, err)
			got, err := val.Validate(context.Background(), ev, attestation.PurposeVerify, nonce)
			if len(tc.wantErrMsgs) > 0 {
				require.ErrorIs(t, err, attestation.ErrMeasurementPolicy)
				var mm *measurements.MismatchError
				require.True(t, errors.As(err, &mm))
				for _, msg := range tc.wantErrMsgs {
					assert.ErrorContains(t, err, msg)
				}
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.wantSet, got.ReferenceSet)
			require.Len(t, got.Warnings, len(tc.wantWarnings)+1, "and the opt-in's")
			for i, w := range tc.wantWarnings {
				assert.Contains(t, got.Warnings[i], w)
			}
		})
	}
}

func TestIssuerNonceSize(t *testing.T) {
	iss, err := qemu.NewIssuer(vtpmtest.Simulator(t), nil, nil)
	require.NoError(t, err)
	for _, n := range [][]byte{nil, make([]byte, 15), make([]byte, 65)} {
		_, err := iss.Issue(context.Background(), attestation.PurposeVerify, n)
		assert.ErrorContains(t, err, "data of")
	}
}

func FuzzValidate(f *testing.F) {
	tpm := vtpmtest.SimulatorFixedSeed(f, 42)
	ref, iss, ev := bootAndIssue(f, tpm)
	val, err := qemu.NewValidator(qemu.ValidatorConfig{ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: measurements.ReferenceSets{{Name: "v1", Measurements: ref}}}, AcceptUnauthenticatedAK: true})
	require.NoError(f, err)
	f.Add(ev)
	f.Add(ev[:len(ev)/2])
	f.Add([]byte{})
	akPub, err := tpm2.DecodePublic(iss.AKPublic())
	require.NoError(f, err)
	akKey, err := akPub.Key()
	require.NoError(f, err)
	akID := vtpmtest.AKID(f, iss.AKPublic())
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := val.Validate(context.Background(), data, attestation.PurposeVerify, nonce)
		if err == nil {
			// Only a quote signed by our TPM's AK may pass: nothing else can sign for it. Its
			// public area may restate attributes the check does not require (which only an AK
			// certificate makes trustworthy), but the key and so the signer's ID are the AK's.
			require.NotNil(t, got)
			e := &vtpmpb.Evidence{}
			require.NoError(t, proto.Unmarshal(data, e))
			pub, err := tpm2.DecodePublic(e.AkPublic)
			require.NoError(t, err)
			key, err := pub.Key()
			require.NoError(t, err)
			require.Equal(t, akKey, key)
			require.Equal(t, akID, got.SignerID)
			return
		}
		require.Nil(t, got)
		require.NotEqual(t, "other", attestation.Reason(err), "every failure has a reason: %v", err)
	})
}

// TestValidatorRefusesLooseSets: the validator the CLI and the join service build refuses
// reference sets that admit more than the image, naming the register, so no path can
// validate evidence against them.
func TestValidatorRefusesLooseSets(t *testing.T) {
	full := measurementstest.Image(qemu.Variant, nil)
	for name, tc := range measurementstest.LooseSets(full) {
		_, err := qemu.NewValidator(qemu.ValidatorConfig{ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: measurements.ReferenceSets{{Name: "loose", Measurements: tc.M}}}, AcceptUnauthenticatedAK: true})
		require.Error(t, err, name)
		assert.ErrorContains(t, err, `reference set "loose": `+tc.Want, name)
	}
}

// nowhere is a TPM that measures nothing: for event logs of a boot no TPM saw.
type nowhere struct{}

func (nowhere) ExtendPCR(int, []byte) error { return nil }

// TestSoftwareKey is the attacker without a TPM: it computes the image's PCR values and event
// log in software and signs a quote over them and the verifier's nonce with an RSA key in
// memory, whose TPMT_PUBLIC claims the attributes of a TPM-resident AK. The qemu package's
// constructor and the registry refuse to build a validator that would accept it (no AK roots)
// unless the caller opts in; then the evidence passes, marked as unauthenticated. With the
// platform's roots it is refused; and the event log is required either way.
func TestSoftwareKey(t *testing.T) {
	forged := vtpmtest.Forge(t, qemu.Variant, mustRSAKey(t), image(), attestation.PurposeATLSServer, nonce)
	// The reference values of the image: exactly what the forger computed, so only the AK
	// can tell the evidence apart.
	tpm := vtpmtest.Simulator(t)
	ref, log := bootNode(t, tpm)
	require.Equal(t, measurementstest.FromRegisters(qemu.Variant, forged.PCRs), ref, "the forger computed the image's PCRs")
	sets := measurements.ReferenceSets{{Name: "image-v1", Measurements: ref}}

	ca, err := vtpmtest.NewPlatformCA("platform AK CA")
	require.NoError(t, err)
	caPEM := []byte(ca.PEM())
	constructors := map[string]func(roots bool, optIn bool) (attestation.Validator, error){
		"qemu.NewValidator": func(roots, optIn bool) (attestation.Validator, error) {
			cfg := qemu.ValidatorConfig{ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: sets, Now: func() time.Time { return testNow }}, AcceptUnauthenticatedAK: optIn}
			if roots {
				cfg.AKRoots = ca.Pool()
			}
			return qemu.NewValidator(cfg)
		},
		"choose.NewValidator": func(roots, optIn bool) (attestation.Validator, error) {
			ref := choose.Reference{Variant: qemu.Variant, Values: choose.Values{Measurements: sets, HardwareValues: choose.HardwareValues{AcceptUnauthenticatedAK: optIn}}}
			if roots {
				ref.AKRoots = string(caPEM)
			}
			return choose.NewValidator(ref, choose.Options{Now: func() time.Time { return testNow }})
		},
	}
	for name, build := range constructors {
		t.Run(name, func(t *testing.T) {
			_, err := build(false, false)
			require.Error(t, err, "a validator without AK roots must not be built without the opt-in")
			assert.ErrorContains(t, err, "AcceptUnauthenticatedAK")
			_, err = build(true, true)
			require.Error(t, err, "the opt-in beside roots would be ignored")

			withRoots, err := build(true, false)
			require.NoError(t, err)
			_, err = withRoots.Validate(context.Background(), forged.Evidence, attestation.PurposeATLSServer, nonce)
			require.ErrorIs(t, err, attestation.ErrUntrustedSigner)
			assert.ErrorContains(t, err, "no AK certificate")

			optedIn, err := build(false, true)
			require.NoError(t, err)
			got, err := optedIn.Validate(context.Background(), forged.Evidence, attestation.PurposeATLSServer, nonce)
			require.NoError(t, err, "with the opt-in, nothing tells a software key from a TPM")
			assert.False(t, got.SignerCertified)
			assert.Equal(t, []string{vtpm.UnauthenticatedAKWarning}, got.Warnings)
			assert.Equal(t, "image-v1", got.ReferenceSet)

			noLog := mutate(t, forged.Evidence, func(e *vtpmpb.Evidence) { e.EventLog = nil })
			_, err = optedIn.Validate(context.Background(), noLog, attestation.PurposeATLSServer, nonce)
			require.ErrorIs(t, err, attestation.ErrMalformed)
			assert.ErrorContains(t, err, "no event log")
		})
	}

	// A genuine node with a certified AK that sends no event log: refused by the validator
	// a cluster uses, too.
	iss, err := qemu.NewIssuer(tpm, nil, log)
	require.NoError(t, err)
	cert, err := ca.CertifyNodeAK(iss.AKPublic(), "worker-0", attestation.RoleWorker, testNow, time.Hour)
	require.NoError(t, err)
	noLogIss, err := qemu.NewIssuer(tpm, cert, func() ([]byte, error) { return nil, nil })
	require.NoError(t, err)
	ev, err := noLogIss.Issue(context.Background(), attestation.PurposeVerify, nonce)
	require.NoError(t, err)
	withRoots, err := constructors["qemu.NewValidator"](true, false)
	require.NoError(t, err)
	_, err = withRoots.Validate(context.Background(), ev, attestation.PurposeVerify, nonce)
	require.ErrorIs(t, err, attestation.ErrMalformed)
	assert.ErrorContains(t, err, "no event log")
}
