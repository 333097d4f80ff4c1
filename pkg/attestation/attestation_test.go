package attestation_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/pkg/attestation"
)

// TestReportData pins the encoding (it is a contract with every validator, including third
// parties that verify nodes) and shows that no two purposes share a value for the same data.
func TestReportData(t *testing.T) {
	data := bytes.Repeat([]byte{0x42}, 32)
	got, err := attestation.ReportData(attestation.PurposeVerify, data)
	require.NoError(t, err)
	want := sha256.Sum256(append([]byte("constellation-evidence-v1\x00verify\x00"), data...))
	assert.Equal(t, hex.EncodeToString(want[:]), hex.EncodeToString(got))
	assert.Len(t, got, attestation.ReportDataSize)

	purposes := []attestation.Purpose{attestation.PurposeATLSServer, attestation.PurposeATLSClient, attestation.PurposeVerify, attestation.PurposeSelfCheck}
	seen := map[string]attestation.Purpose{}
	for _, p := range purposes {
		rd, err := attestation.ReportData(p, data)
		require.NoError(t, err)
		if other, ok := seen[string(rd)]; ok {
			t.Fatalf("purposes %s and %s share report data", p, other)
		}
		seen[string(rd)] = p
		assert.NotEqual(t, data, rd, "data is never bound as it is")
	}
}

func TestReportDataRefusals(t *testing.T) {
	for name, tc := range map[string]struct {
		purpose attestation.Purpose
		data    []byte
		want    string
	}{
		"no purpose":     {attestation.Purpose{}, make([]byte, 32), "without a purpose"},
		"data too short": {attestation.PurposeVerify, make([]byte, 15), "verify data of 15 bytes: want 16..64"},
		"data too long":  {attestation.PurposeATLSClient, make([]byte, 65), "atls-client data of 65 bytes: want 16..64"},
		"no data":        {attestation.PurposeATLSServer, nil, "data of 0 bytes"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := attestation.ReportData(tc.purpose, tc.data)
			assert.ErrorContains(t, err, tc.want)
		})
	}
}

// Every label Reason returns is a reason; nothing else is (a peer's label is kept only then).
func TestIsReason(t *testing.T) {
	for _, err := range []error{attestation.ErrMalformed, attestation.ErrTooLarge, attestation.ErrWrongVariant, attestation.ErrBadSignature,
		attestation.ErrNonceMismatch, attestation.ErrUntrustedSigner, attestation.ErrRevocationUnknown, attestation.ErrMeasurementPolicy, errors.New("x")} {
		assert.True(t, attestation.IsReason(attestation.Reason(err)), "%v", err)
	}
	for _, label := range []string{"", "peer-abort", "Measurement-Mismatch", "measurement-mismatch\n", "\x1b[2J"} {
		assert.False(t, attestation.IsReason(label), "%q", label)
	}
}
