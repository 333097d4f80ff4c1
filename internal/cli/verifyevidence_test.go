package cli

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/eventlog/eventlogtest"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/measurements/measurementstest"
	"github.com/openconstellation/constellation/pkg/attestation/qemu"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/vtpmtest"
)

// evidenceFixture is qemu-vtpm evidence of a simulated node, bound to nonce for the
// verification service, and the files verify-evidence reads.
type evidenceFixture struct {
	dir, evidence, answer, reference string
	nonce                            []byte
}

func newEvidenceFixture(t *testing.T) evidenceFixture {
	tpm := vtpmtest.Simulator(t)
	log := eventlogtest.Boot(t, tpm, eventlogtest.Image("verify-evidence"))
	pcrs, err := tpm.ReadPCRs()
	require.NoError(t, err)
	iss, err := qemu.NewIssuer(tpm, nil, func() ([]byte, error) { return log, nil })
	require.NoError(t, err)
	t.Cleanup(func() { _ = iss.Close() })
	nonce := bytes.Repeat([]byte{0x5a}, 32)
	ev, err := iss.Issue(context.Background(), attestation.PurposeVerify, nonce)
	require.NoError(t, err)

	f := evidenceFixture{dir: t.TempDir(), nonce: nonce}
	f.evidence = filepath.Join(f.dir, "evidence.bin")
	require.NoError(t, os.WriteFile(f.evidence, ev, 0o600))
	answer, err := json.Marshal(map[string]string{"variant": "qemu-vtpm", "evidence": base64.StdEncoding.EncodeToString(ev)})
	require.NoError(t, err)
	f.answer = filepath.Join(f.dir, "answer.json")
	require.NoError(t, os.WriteFile(f.answer, answer, 0o600))
	ref, err := choose.Reference{Variant: variant.QEMUVTPM, Values: choose.Values{
		Measurements:   measurements.ReferenceSets{{Name: "image-v1", Measurements: measurementstest.FromRegisters(variant.QEMUVTPM, pcrs)}},
		HardwareValues: choose.HardwareValues{AcceptUnauthenticatedAK: true},
	}}.Encode()
	require.NoError(t, err)
	f.reference = filepath.Join(f.dir, "reference.json")
	require.NoError(t, os.WriteFile(f.reference, ref, 0o600))
	return f
}

func (f evidenceFixture) opts() evidenceOptions {
	return evidenceOptions{variant: "qemu-vtpm", reference: f.reference, revocation: "required", output: "text", offline: true}
}

// TestVerifyEvidence: evidence from a file (raw, or a verification service's JSON answer)
// verifies against a reference with a nonce or the equivalent raw report data; every wrong
// binding, a tampered file and a wrong reference are refused with the reason.
func TestVerifyEvidence(t *testing.T) {
	f := newEvidenceFixture(t)
	rd, err := attestation.ReportData(attestation.PurposeVerify, f.nonce)
	require.NoError(t, err)

	for name, tc := range map[string]struct {
		file   string
		mutate func(*evidenceOptions)
	}{
		"raw evidence, --nonce":         {f.evidence, func(o *evidenceOptions) { o.nonce = hex.EncodeToString(f.nonce) }},
		"service answer, --nonce":       {f.answer, func(o *evidenceOptions) { o.nonce = hex.EncodeToString(f.nonce) }},
		"raw evidence, --report-data":   {f.evidence, func(o *evidenceOptions) { o.reportData = hex.EncodeToString(rd) }},
		"service answer, json output":   {f.answer, func(o *evidenceOptions) { o.nonce = hex.EncodeToString(f.nonce); o.output = "json" }},
		"collateral listed (none here)": {f.evidence, func(o *evidenceOptions) { o.listCollateral = true }},
	} {
		t.Run(name, func(t *testing.T) {
			o := f.opts()
			tc.mutate(&o)
			var out bytes.Buffer
			require.NoError(t, runVerifyEvidence(context.Background(), &out, nil, tc.file, o))
			switch {
			case o.listCollateral:
				assert.Empty(t, out.String())
			case o.output == "json":
				var claims evidenceClaims
				require.NoError(t, json.Unmarshal(out.Bytes(), &claims))
				assert.Equal(t, "image-v1", claims.ReferenceSet)
				assert.Equal(t, hex.EncodeToString(rd), claims.ReportData)
			default:
				assert.Contains(t, out.String(), `OK    qemu-vtpm evidence bound to `+hex.EncodeToString(rd)+`, reference set "image-v1"`)
			}
		})
	}

	tampered := filepath.Join(f.dir, "tampered.bin")
	ev, err := os.ReadFile(f.evidence)
	require.NoError(t, err)
	ev[len(ev)/2] ^= 1
	require.NoError(t, os.WriteFile(tampered, ev, 0o600))
	otherRef := filepath.Join(f.dir, "other.json")
	require.NoError(t, os.WriteFile(otherRef, []byte(`{"variant":"aws-nitro-tpm","measurements":[]}`), 0o600))

	for name, tc := range map[string]struct {
		file   string
		mutate func(*evidenceOptions)
		want   string
	}{
		"another nonce":         {f.evidence, func(o *evidenceOptions) { o.nonce = strings.Repeat("11", 32) }, "nonce-mismatch"},
		"the nonce as raw data": {f.evidence, func(o *evidenceOptions) { o.reportData = hex.EncodeToString(f.nonce) }, "nonce-mismatch"},
		"no binding":            {f.evidence, func(o *evidenceOptions) {}, "exactly one of --report-data"},
		"both bindings":         {f.evidence, func(o *evidenceOptions) { o.nonce, o.reportData = "00", "00" }, "exactly one of --report-data"},
		"tampered evidence":     {tampered, func(o *evidenceOptions) { o.nonce = hex.EncodeToString(f.nonce) }, "evidence refused"},
		"answer of another variant": {f.answer, func(o *evidenceOptions) {
			o.variant, o.reference = "aws-nitro-tpm", otherRef
		}, `evidence of variant "qemu-vtpm", --variant is aws-nitro-tpm`},
		"reference of another variant": {f.evidence, func(o *evidenceOptions) { o.reference = otherRef; o.nonce = "00" }, "is for variant aws-nitro-tpm"},
		"unknown revocation policy":    {f.evidence, func(o *evidenceOptions) { o.revocation = "maybe"; o.nonce = "00" }, "--revocation"},
		"save collateral offline":      {f.evidence, func(o *evidenceOptions) { o.saveCollateral = "x.json"; o.nonce = "00" }, "drop --offline"},
		"no reference":                 {f.evidence, func(o *evidenceOptions) { o.reference = ""; o.nonce = "00" }, "--reference: required"},
		"unknown variant":              {f.evidence, func(o *evidenceOptions) { o.variant = "qemu-sgx" }, "--variant"},
	} {
		t.Run(name, func(t *testing.T) {
			o := f.opts()
			tc.mutate(&o)
			err := runVerifyEvidence(context.Background(), &bytes.Buffer{}, nil, tc.file, o)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestVerifyEvidenceRefusesAmbiguousAnswers: a verification service's answer is one JSON
// object with one spelling per field. encoding/json alone read the first of two answers (and
// printed OK for it), and the last of two "evidence" fields, in any letter case.
func TestVerifyEvidenceRefusesAmbiguousAnswers(t *testing.T) {
	f := newEvidenceFixture(t)
	answer, err := os.ReadFile(f.answer)
	require.NoError(t, err)
	other, err := json.Marshal(map[string]string{"variant": "qemu-vtpm", "evidence": base64.StdEncoding.EncodeToString([]byte("other evidence"))})
	require.NoError(t, err)
	inner := strings.TrimSuffix(strings.TrimPrefix(string(answer), "{"), "}")
	for name, tc := range map[string]struct {
		data, want string
	}{
		"a second answer after the first": {string(answer) + "\n" + string(other), "data after the JSON value"},
		"a stray brace after the answer":  {string(answer) + "}", "data after the JSON value"},
		"evidence twice":                  {`{"evidence":"b3RoZXI=",` + inner + `}`, `duplicate member name "evidence"`},
		"Evidence beside evidence":        {`{` + inner + `,"Evidence":"b3RoZXI="}`, "letter case"},
		"Variant beside variant":          {`{"Variant":"aws-nitro-tpm",` + inner + `}`, "letter case"},
	} {
		t.Run(name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "answer.json")
			require.NoError(t, os.WriteFile(file, []byte(tc.data), 0o600))
			o := f.opts()
			o.nonce = hex.EncodeToString(f.nonce)
			var out bytes.Buffer
			err := runVerifyEvidence(context.Background(), &out, nil, file, o)
			require.Error(t, err, "accepted: %s", out.String())
			assert.ErrorContains(t, err, "not a verification service's answer")
			assert.ErrorContains(t, err, tc.want)
			assert.NotContains(t, out.String(), "OK")
		})
	}
}

// TestVerifyEvidenceStdin: "-" reads the evidence from standard input, bounded.
func TestVerifyEvidenceStdin(t *testing.T) {
	f := newEvidenceFixture(t)
	ev, err := os.ReadFile(f.answer)
	require.NoError(t, err)
	o := f.opts()
	o.nonce = hex.EncodeToString(f.nonce)
	var out bytes.Buffer
	require.NoError(t, runVerifyEvidence(context.Background(), &out, bytes.NewReader(ev), "-", o))
	assert.Contains(t, out.String(), `reference set "image-v1"`)

	err = runVerifyEvidence(context.Background(), &out, bytes.NewReader(make([]byte, maxEvidenceFile+1)), "-", o)
	assert.ErrorContains(t, err, "not evidence")
}
