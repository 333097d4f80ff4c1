package azure

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/measuredboot"
	"github.com/openconstellation/constellation/internal/measuredboot/measuredboottest"
	"github.com/openconstellation/constellation/internal/provider/qemu"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/snp"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// writeTestImage writes a node OS image folder of a synthetic UKI and GPT disk to dir.
func writeTestImage(t *testing.T, dir string) {
	t.Helper()
	kernel := measuredboottest.PE([]measuredboottest.Section{{Name: ".text", Data: bytes.Repeat([]byte{0x90}, 1000)}}, nil)
	uki := measuredboottest.UKI([]byte("ID=debian\n"), []byte("console=ttyS0 roothash=00ff"), kernel, bytes.Repeat([]byte("initrd"), 100))
	require.NoError(t, os.WriteFile(filepath.Join(dir, qemu.UKIFile), uki, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, qemu.DiskFile), measuredboottest.GPT(0, 1), 0o644))
}

// testFirmwareRecord is a record of observed values (made up: no project member observed
// Azure's) for variant v.
func testFirmwareRecord(t *testing.T, v variant.Variant) []byte {
	t.Helper()
	observed := measurements.M{}
	for _, r := range measuredboot.FirmwareRegisters {
		observed[r] = measurements.Measurement{Expected: bytes.Repeat([]byte{byte(r + 1)}, 32)}
	}
	rec := FirmwareRecord{Variant: v.String(), Source: "test values, observed nowhere", Observed: observed}
	ref := snp.DefaultReference("milan")
	ref.Products = []string{"Milan"}
	ref.MinimumTCB = map[string]snp.TCB{"Milan": {Bootloader: 3, SNP: 8, Microcode: 115}}
	ref.Measurements = snp.Digests{bytes.Repeat([]byte{1}, 48)}
	rec.SNP = &ref
	raw, err := json.Marshal(rec)
	require.NoError(t, err)
	return raw
}

func TestReferenceValues(t *testing.T) {
	dir := t.TempDir()
	writeTestImage(t, dir)
	_, err := Platform{}.ReferenceValues(dir)
	require.ErrorContains(t, err, "the registers Azure's firmware measures (PCR 0-3, 6, 7) cannot be predicted: pass the values observed on a node with --firmware-record")

	p, err := Platform{}.WithFirmwareRecord(testFirmwareRecord(t, variant.AzureSEVSNP))
	require.NoError(t, err)
	rv, err := p.ReferenceValues(dir)
	require.NoError(t, err)
	assert.Equal(t, variant.AzureSEVSNP, rv.Variant)
	require.NotNil(t, rv.Hardware.SNP)
	require.NoError(t, rv.Measurements.Validate(variant.AzureSEVSNP), "every register the image measures, enforced")
	assert.Equal(t, bytes.Repeat([]byte{1}, 32), rv.Measurements[0].Expected, "PCR 0 as observed")
	assert.Contains(t, rv.Components[0][0], "observed: test values, observed nowhere")
	assert.NotEmpty(t, rv.Components[4], "PCR 4 predicted from the UKI")
}

func TestFirmwareRecordRefuses(t *testing.T) {
	good := testFirmwareRecord(t, variant.AzureSEVSNP)
	for name, tc := range map[string]struct {
		edit    func(string) string
		wantErr string
	}{
		"another variant":  {edit: func(s string) string { return strings.Replace(s, `"azure-sev-snp"`, `"qemu-vtpm"`, 1) }, wantErr: `variant "qemu-vtpm": want azure-sev-snp or azure-tdx`},
		"no source":        {edit: func(s string) string { return strings.Replace(s, `"test values, observed nowhere"`, `""`, 1) }, wantErr: "source must say"},
		"an unknown field": {edit: func(s string) string { return strings.Replace(s, `"source"`, `"sauce"`, 1) }, wantErr: "sauce"},
		"an image register": {edit: func(s string) string {
			return strings.Replace(s, `"observed":{`, `"observed":{"4":{"expected":"`+strings.Repeat("00", 32)+`","warnOnly":false},`, 1)
		}, wantErr: "observed PCR 4 is not a firmware register"},
		"no hardware block":  {edit: func(s string) string { return s[:strings.Index(s, `,"snp"`)] + "}" }, wantErr: "snp: required"},
		"a TDX block on SNP": {edit: func(s string) string { return strings.Replace(s, `"snp"`, `"tdx"`, 1) }, wantErr: "TDX reference"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Platform{}.WithFirmwareRecord([]byte(tc.edit(string(good))))
			assert.ErrorContains(t, err, tc.wantErr)
		})
	}
}
