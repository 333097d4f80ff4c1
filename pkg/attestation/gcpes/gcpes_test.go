package gcpes_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"io"
	"os"
	"testing"
	"time"

	"github.com/google/go-eventlog/tcg"
	"github.com/google/go-tpm-tools/client"
	attestpb "github.com/google/go-tpm-tools/proto/attest"
	tpmpb "github.com/google/go-tpm-tools/proto/tpm"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/openconstellation/constellation/pkg/api/attestation/vtpmpb"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/eventlog"
	"github.com/openconstellation/constellation/pkg/attestation/eventlog/eventlogtest"
	"github.com/openconstellation/constellation/pkg/attestation/gce"
	"github.com/openconstellation/constellation/pkg/attestation/gcpes"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/measurements/measurementstest"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/vtpmtest"
)

var (
	data    = bytes.Repeat([]byte{0x42}, 32)
	testNow = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
)

// realGCE returns a real GCE Confidential VM (AMD SEV) attestation, converted to gcp-sev-es
// evidence, and its replayable parts.
func realGCE(t *testing.T) (evidence []byte, log []byte, pcrs map[uint32][]byte) {
	raw, err := os.ReadFile("../eventlog/testdata/gce-cos-85-nonce9009.pb")
	require.NoError(t, err)
	att := &attestpb.Attestation{}
	require.NoError(t, proto.Unmarshal(raw, att))
	for _, q := range att.GetQuotes() {
		if q.GetPcrs().GetHash() != tpmpb.HashAlgo_SHA256 {
			continue
		}
		ev := &vtpmpb.Evidence{
			Variant: gcpes.Variant.String(), AkPublic: att.GetAkPub(), AkCert: att.GetAkCert(),
			Quote: q.GetQuote(), Signature: q.GetRawSig(), EventLog: att.GetEventLog(),
		}
		for i := range uint32(vtpm.NumPCRs) {
			ev.Pcrs = append(ev.Pcrs, q.GetPcrs().GetPcrs()[i])
		}
		b, err := proto.Marshal(ev)
		require.NoError(t, err)
		return b, att.GetEventLog(), q.GetPcrs().GetPcrs()
	}
	t.Fatal("no SHA-256 quote")
	return nil, nil, nil
}

// TestRealGCEEvidence runs a real GCE attestation through the production validator. Its
// quote was made for go-tpm-tools' nonce, not for a Constellation purpose, so it must fail
// exactly there: after its AK certificate chained to Google's pinned roots and its signature
// verified.
func TestRealGCEEvidence(t *testing.T) {
	evidence, log, pcrs := realGCE(t)
	sets := measurements.ReferenceSets{{Name: "zero", Measurements: measurementstest.Image(gcpes.Variant, nil)}}

	v, err := gcpes.NewValidator(gcpes.ValidatorConfig{ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: sets, Now: func() time.Time { return testNow }}})
	require.NoError(t, err)
	_, err = v.Validate(context.Background(), evidence, attestation.PurposeVerify, data)
	require.ErrorIs(t, err, attestation.ErrNonceMismatch, "AK certificate and signature pass, only the nonce differs")

	other := vtpmtest.NewCA(t, "not Google", nil)
	v, err = gcpes.NewValidator(gcpes.ValidatorConfig{ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: sets, Now: func() time.Time { return testNow }}, AKRoots: other.Pool()})
	require.NoError(t, err)
	_, err = v.Validate(context.Background(), evidence, attestation.PurposeVerify, data)
	require.ErrorIs(t, err, attestation.ErrUntrustedSigner)

	// The real log replays to the real quoted PCRs, and its claim is SEV, not SEV-ES.
	replayed, err := eventlog.Replay(log, pcrs)
	require.NoError(t, err)
	err = gcpes.CheckSEVES(replayed)
	require.ErrorIs(t, err, attestation.ErrMeasurementPolicy)
	assert.ErrorContains(t, err, "claims confidential technology AMD-SEV, want AMD-SEV-ES")
}

func nonHostInfo(tech byte) []byte {
	d := append([]byte("GCE NonHostInfo\x00"), tech)
	return append(d, make([]byte, 15)...)
}

// gceBoot is a GCE firmware boot: PCR 0 records the firmware and the NonHostInfo event.
func gceBoot(nonHost []byte, afterSeparator bool) []eventlogtest.Measurement {
	pcr0 := []eventlogtest.Measurement{{PCR: 0, Type: tcg.SCRTMVersion, Data: []byte("GCE Virtual Firmware v1\x00")}}
	sep := eventlogtest.Measurement{PCR: 0, Type: tcg.Separator, Data: []byte{0, 0, 0, 0}}
	nh := eventlogtest.Measurement{PCR: 0, Type: tcg.NonhostInfo, Data: nonHost}
	switch {
	case nonHost == nil:
		pcr0 = append(pcr0, sep)
	case afterSeparator:
		pcr0 = append(pcr0, sep, nh)
	default:
		pcr0 = append(pcr0, nh, sep)
	}
	var rest []eventlogtest.Measurement
	for _, m := range eventlogtest.Image("v1") {
		if m.PCR != 0 {
			rest = append(rest, m)
		}
	}
	return append(pcr0, rest...)
}

// gceVM provisions a simulator as GCE does (AK template and certificate in NV), boots it
// and returns evidence from the production issuer and the matching validator config.
func gceVM(t *testing.T, boot []eventlogtest.Measurement) ([]byte, gcpes.ValidatorConfig) {
	return gceVMOn(t, vtpmtest.Simulator(t), boot)
}

func gceVMOn(t *testing.T, tpm *vtpm.TPM, boot []eventlogtest.Measurement) ([]byte, gcpes.ValidatorConfig) {
	root := vtpmtest.NewCA(t, "test Google EK/AK root", nil)
	inter := vtpmtest.NewCA(t, "test Google EK/AK intermediate", root)
	tmpl, err := client.AKTemplateRSA().Encode()
	require.NoError(t, err)
	require.NoError(t, tpm.WriteNV(client.GceAKTemplateNVIndexRSA, tmpl))
	var akKey crypto.PublicKey
	require.NoError(t, tpm.With(func(rw io.ReadWriter) error {
		ak, err := client.GceAttestationKeyRSA(rw)
		if err != nil {
			return err
		}
		defer ak.Close()
		akKey = ak.PublicKey()
		return nil
	}))
	require.NoError(t, tpm.WriteNV(gce.AKCertNVIndex, inter.CertifyAK(t, akKey, "projects/p/zones/z/instances/node-0")))

	log := eventlogtest.Boot(t, tpm, boot)
	iss, err := gcpes.NewIssuer(tpm, gcpes.IssuerConfig{EventLog: func() ([]byte, error) { return log, nil }})
	require.NoError(t, err)
	t.Cleanup(func() { iss.Close() })
	ev, err := iss.Issue(context.Background(), attestation.PurposeVerify, data)
	require.NoError(t, err)
	pcrs, err := tpm.ReadPCRs()
	require.NoError(t, err)
	return ev, gcpes.ValidatorConfig{
		ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: measurements.ReferenceSets{{Name: "v1", Measurements: measurementstest.FromRegisters(gcpes.Variant, pcrs)}}, Now: func() time.Time { return testNow }},
		AKRoots:         root.Pool(),
		AKIntermediates: []*x509.Certificate{inter.Cert},
	}
}

func TestGCPSEVES(t *testing.T) {
	validate := func(t *testing.T, ev []byte, cfg gcpes.ValidatorConfig) (*attestation.Verified, error) {
		v, err := gcpes.NewValidator(cfg)
		require.NoError(t, err)
		return v.Validate(context.Background(), ev, attestation.PurposeVerify, data)
	}
	const sevES, sev = 2, 1

	t.Run("genuine SEV-ES boot", func(t *testing.T) {
		ev, cfg := gceVM(t, gceBoot(nonHostInfo(sevES), false))
		got, err := validate(t, ev, cfg)
		require.NoError(t, err)
		assert.True(t, got.SignerCertified)
		assert.Equal(t, "projects/p/zones/z/instances/node-0", got.SignerName)
	})

	testCases := map[string]struct {
		boot    []eventlogtest.Measurement
		tamper  func(ev *vtpmpb.Evidence)
		mod     func(*gcpes.ValidatorConfig)
		wantErr error
		wantMsg string
	}{
		"firmware claims SEV, not SEV-ES": {
			boot: gceBoot(nonHostInfo(sev), false), wantErr: attestation.ErrMeasurementPolicy, wantMsg: "claims confidential technology AMD-SEV, want AMD-SEV-ES",
		},
		"no NonHostInfo event": {
			boot: gceBoot(nil, false), wantErr: attestation.ErrMeasurementPolicy, wantMsg: "NONE (or no NonHostInfo event)",
		},
		"NonHostInfo after the separator (not firmware's)": {
			boot: gceBoot(nonHostInfo(sevES), true), wantErr: attestation.ErrMeasurementPolicy, wantMsg: "NONE",
		},
		"NonHostInfo data rewritten to SEV-ES on a SEV boot": {
			boot: gceBoot(nonHostInfo(sev), false),
			tamper: func(ev *vtpmpb.Evidence) {
				i := bytes.Index(ev.EventLog, []byte("GCE NonHostInfo\x00"))
				ev.EventLog[i+16] = sevES
			},
			wantErr: attestation.ErrMalformed, wantMsg: "PCR 0, EV_NONHOST_INFO): data does not match its digest",
		},
		"no event log": {
			boot: gceBoot(nonHostInfo(sevES), false), tamper: func(ev *vtpmpb.Evidence) { ev.EventLog = nil },
			wantErr: attestation.ErrMalformed, wantMsg: "no event log",
		},
		"event log digest": {
			boot: gceBoot(nonHostInfo(sevES), false),
			tamper: func(ev *vtpmpb.Evidence) {
				d := sha256.Sum256(nonHostInfo(sevES))
				ev.EventLog[bytes.Index(ev.EventLog, d[:])] ^= 1
			},
			wantErr: attestation.ErrMalformed, wantMsg: "quoted value of PCR 0",
		},
		"AK certificate not by Google (pinned roots)": {
			boot: gceBoot(nonHostInfo(sevES), false), mod: func(c *gcpes.ValidatorConfig) { c.AKRoots = nil },
			wantErr: attestation.ErrUntrustedSigner, wantMsg: "AK certificate",
		},
		"PCR 9 value": {
			boot: gceBoot(nonHostInfo(sevES), false), tamper: func(ev *vtpmpb.Evidence) { ev.Pcrs[9][0] ^= 1 },
			wantErr: attestation.ErrBadSignature,
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			ev, cfg := gceVM(t, tc.boot)
			if tc.tamper != nil {
				pbEv := &vtpmpb.Evidence{}
				require.NoError(t, proto.Unmarshal(ev, pbEv))
				tc.tamper(pbEv)
				var err error
				ev, err = proto.Marshal(pbEv)
				require.NoError(t, err)
			}
			if tc.mod != nil {
				tc.mod(&cfg)
			}
			_, err := validate(t, ev, cfg)
			require.ErrorIs(t, err, tc.wantErr)
			assert.ErrorContains(t, err, tc.wantMsg)
		})
	}
}

// TestGCPSEVESSwtpm runs the issuer against a real swtpm process.
func TestGCPSEVESSwtpm(t *testing.T) {
	if testing.Short() {
		t.Skip("starts swtpm")
	}
	tpm, _ := vtpmtest.Swtpm(t)
	ev, cfg := gceVMOn(t, tpm, gceBoot(nonHostInfo(2), false))
	v, err := gcpes.NewValidator(cfg)
	require.NoError(t, err)
	got, err := v.Validate(context.Background(), ev, attestation.PurposeVerify, data)
	require.NoError(t, err)
	assert.True(t, got.SignerCertified)
}
