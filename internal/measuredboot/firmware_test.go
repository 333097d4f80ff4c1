package measuredboot

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/measuredboot/measuredboottest"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// placeholderRecord is a test fixture: its values were never observed in a boot.
func placeholderRecord(t *testing.T) FirmwareRecord {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "firmware-placeholder.json"))
	require.NoError(t, err)
	r, err := ParseFirmwareRecord(raw)
	require.NoError(t, err)
	return r
}

func TestParseFirmwareRecord(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "firmware-placeholder.json"))
	require.NoError(t, err)
	good := string(raw)
	tests := map[string]struct {
		edit    func(string) string
		wantErr string
	}{
		"fixture":       {edit: func(s string) string { return s }},
		"unknown field": {edit: func(s string) string { return strings.Replace(s, `"source"`, `"sauce": "x", "source"`, 1) }, wantErr: "sauce"},
		"image register observed": {edit: func(s string) string {
			return strings.Replace(s, `"0": `, `"4": "a400000000000000000000000000000000000000000000000000000000000000", "0": `, 1)
		}, wantErr: "observed PCR 4 is not a firmware register"},
		"firmware register absent": {edit: func(s string) string {
			return strings.Replace(s, `"6": "a600000000000000000000000000000000000000000000000000000000000000",`, ``, 1)
		}, wantErr: "observed PCR 6 is missing"},
		"image's partition table observed": {edit: func(s string) string {
			return strings.Replace(s, `"0": `, `"5": "a500000000000000000000000000000000000000000000000000000000000000", "0": `, 1)
		}, wantErr: "observed PCR 5 is not a firmware register"},
		"warn-only register": {edit: func(s string) string { return strings.Replace(s, `"warnOnly": false`, `"warnOnly": true`, 1) }, wantErr: "observed PCR 7 is warn-only"},
		"short digest": {edit: func(s string) string {
			return strings.Replace(s, `"a000000000000000000000000000000000000000000000000000000000000000"`, `"a0"`, 1)
		}, wantErr: "observed PCR 0 has 1 bytes"},
		"firmware not hashed": {edit: func(s string) string {
			return strings.Replace(s, `"1111111111111111111111111111111111111111111111111111111111111111"`, `"OVMF_CODE_4M.fd"`, 1)
		}, wantErr: "codeSHA256"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := ParseFirmwareRecord([]byte(tc.edit(good)))
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tc.wantErr)
		})
	}
}

func TestFirmwareRecords(t *testing.T) {
	// The shipped records (possibly none yet) must all be valid.
	_, err := FirmwareRecords()
	require.NoError(t, err)

	raw, err := os.ReadFile(filepath.Join("testdata", "firmware-placeholder.json"))
	require.NoError(t, err)
	fsys := fstest.MapFS{"firmware/a.json": {Data: raw}, "firmware/README.md": {Data: []byte("#")}}
	records, err := loadRecords(fsys, "firmware")
	require.NoError(t, err)
	require.Len(t, records, 1)

	rec := records[0]
	found, err := FindFirmware(records, rec.Firmware, rec.Shape)
	require.NoError(t, err)
	assert.Equal(t, rec.Source, found.Source)

	otherVars := rec.Firmware
	otherVars.VarsSHA256 = strings.Repeat("3", 64)
	_, err = FindFirmware(records, otherVars, rec.Shape)
	assert.ErrorIs(t, err, ErrNoFirmwareRecord)

	bigger := rec.Shape
	bigger.MemoryMiB *= 2
	_, err = FindFirmware(records, rec.Firmware, bigger)
	assert.ErrorIs(t, err, ErrNoFirmwareRecord)

	_, err = loadRecords(fstest.MapFS{"firmware/bad.json": {Data: []byte(`{"firmware": {}}`)}}, "firmware")
	assert.ErrorContains(t, err, "bad.json")
}

func TestHashFirmware(t *testing.T) {
	dir := t.TempDir()
	code, vars := filepath.Join(dir, "code.fd"), filepath.Join(dir, "vars.fd")
	require.NoError(t, os.WriteFile(code, []byte("code"), 0o600))
	require.NoError(t, os.WriteFile(vars, []byte("vars"), 0o600))
	b, err := HashFirmware("ovmf", "1", code, vars)
	require.NoError(t, err)
	// sha256("code"), sha256("vars")
	assert.Equal(t, "5694d08a2e53ffcae0c3103e5ad6f6076abd960eb1f8a56577040bc1028f702b", b.CodeSHA256)
	assert.Equal(t, "0f4167b44403cbfb049fca25656890301d91d676a4589a1b9ddf0410930f06bd", b.VarsSHA256)
	_, err = HashFirmware("ovmf", "1", filepath.Join(dir, "missing"), vars)
	assert.Error(t, err)
}

func TestReferenceMeasurements(t *testing.T) {
	rec := placeholderRecord(t)
	image := measuredboottest.UKI(testOsrel, []byte(testCmdline), testKernel, testInitrd)
	m, p, err := ReferenceMeasurements(variant.QEMUVTPM, image, bytes.NewReader(measuredboottest.GPT(0, 1)), rec)
	require.NoError(t, err)
	require.NoError(t, m.Validate(variant.QEMUVTPM), "a set the configuration accepts")

	for i := uint32(0); i < 15; i++ {
		require.Contains(t, m, i)
		assert.False(t, m[i].WarnOnly, "PCR %d enforced", i)
	}
	assert.NotContains(t, m, uint32(15), "the cluster-ID register is never a reference value")
	for _, r := range FirmwareRegisters {
		assert.Equal(t, rec.Observed[r].Expected, m[r].Expected, "PCR %d observed", r)
	}
	_, _, err = ReferenceMeasurements(variant.QEMUVTPM, image, bytes.NewReader(make([]byte, 4096)), rec)
	assert.ErrorContains(t, err, "partition table")
	for _, r := range []uint32{4, 5, 9, 11} {
		v := p.Value(r)
		assert.Equal(t, v[:], m[r].Expected, "PCR %d predicted", r)
	}
	for _, r := range []uint32{8, 12, 13, 14} {
		assert.Equal(t, make([]byte, 32), m[r].Expected, "PCR %d zero", r)
	}
	var first10 [10][32]byte
	for i := range first10 {
		copy(first10[i][:], m[uint32(i)].Expected)
	}
	ima := extend([32]byte{}, PredictIMA(first10).Digest)
	assert.Equal(t, ima[:], m[10].Expected)

	_, _, err = ReferenceMeasurements(variant.QEMUVTPM, []byte("not a UKI"), bytes.NewReader(measuredboottest.GPT(0)), rec)
	assert.ErrorIs(t, err, ErrMalformedUKI)
	bad := rec
	bad.Source = ""
	_, _, err = ReferenceMeasurements(variant.QEMUVTPM, image, bytes.NewReader(measuredboottest.GPT(0)), bad)
	assert.ErrorContains(t, err, "source")
}
