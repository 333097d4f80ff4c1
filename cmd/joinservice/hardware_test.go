package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/clusterrecord"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/measurements/measurementstest"
	"github.com/openconstellation/constellation/pkg/attestation/snp"
	"github.com/openconstellation/constellation/pkg/attestation/tdx"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// snpReference and tdxReference are valid hardware blocks, built as pkg/attestation/choose's
// tests build them.
func snpReference() *snp.Reference {
	ref := snp.DefaultReference("milan-2025")
	ref.Products = []string{"Milan"}
	ref.MinimumTCB = map[string]snp.TCB{"Milan": {Bootloader: 3, TEE: 0, SNP: 8, Microcode: 115}}
	ref.Measurements = snp.Digests{bytes.Repeat([]byte{1}, 48)}
	return &ref
}

func tdxReference() *tdx.Reference {
	return &tdx.Reference{
		Name:             "tdx-1.5",
		MrSeam:           []tdx.HexBytes{bytes.Repeat([]byte{2}, 48)},
		TdAttributes:     make(tdx.HexBytes, 8),
		Xfam:             tdx.HexBytes{0xe7, 0x18, 0x06, 0, 0, 0, 0, 0},
		MinimumTeeTcbSvn: make(tdx.HexBytes, 16),
	}
}

// writeRecord writes what the DaemonSet mounts for att into a new directory; without
// hardware.json if drop says so (a record of an init before the key existed).
func writeRecord(t *testing.T, att choose.Reference, drop bool) string {
	t.Helper()
	clusterID := bytes.Repeat([]byte{7}, 32)
	record, err := json.Marshal(clusterrecord.Cluster{
		Name: "demo", ClusterID: hex.EncodeToString(clusterID), MeasurementSalt: base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0x42}, 32)),
		KubernetesVersion: "v1.34.4", ClusterIDMarker: hex.EncodeToString(variant.QEMUVTPM.ClusterIDMarker(clusterID)),
	})
	require.NoError(t, err)
	data, err := clusterrecord.AttestationData(att)
	require.NoError(t, err)
	dir := t.TempDir()
	writeFile(t, dir, clusterrecord.ClusterKey, record)
	for k, v := range data {
		if drop && k == clusterrecord.HardwareKey {
			continue
		}
		writeFile(t, dir, k, []byte(v))
	}
	return dir
}

// The join service of a cluster on a hardware variant reads the variant's hardware block
// from the record and builds its validator from it, with the hot-reloaded reference sets.
func TestReadConfigHardwareVariants(t *testing.T) {
	for name, att := range map[string]choose.Reference{
		"aws-sev-snp": {Variant: variant.AWSSEVSNP, Values: choose.Values{Measurements: measurements.ReferenceSets{{Name: "image-v1", Measurements: measurementstest.Image(variant.AWSSEVSNP, nil)}},
			HardwareValues: choose.HardwareValues{SNP: snpReference()}}},
		"qemu-tdx": {Variant: variant.QEMUTDX, Values: choose.Values{Measurements: measurements.ReferenceSets{{Name: "image-v1", Measurements: measurementstest.Image(variant.QEMUTDX, nil)}},
			HardwareValues: choose.HardwareValues{TDX: tdxReference()}}},
	} {
		t.Run(name, func(t *testing.T) {
			dir := writeRecord(t, att, false)
			_, got, err := readConfig(dir)
			require.NoError(t, err)
			assert.Equal(t, att, got)

			active, err := measurements.NewActive(got.Variant, got.Measurements)
			require.NoError(t, err)
			v, err := newValidator(got, active, slog.New(slog.DiscardHandler))
			require.NoError(t, err)
			assert.Equal(t, att.Variant, v.Variant())

			// Without hardware.json the variant's block is missing: refused at start, naming it.
			_, _, err = readConfig(writeRecord(t, att, true))
			assert.ErrorContains(t, err, "attestation configuration in")
			assert.ErrorContains(t, err, "required")
		})
	}
}

// A record of an older init (no hardware.json) of a variant without a hardware block still
// starts the service.
func TestReadConfigWithoutHardwareKey(t *testing.T) {
	att := choose.Reference{Variant: variant.AWSNitroTPM, Values: choose.Values{Measurements: measurements.ReferenceSets{{Name: "image-v1", Measurements: measurementstest.Image(variant.AWSNitroTPM, nil)}}, HardwareValues: choose.HardwareValues{AcceptUnauthenticatedAK: true}}}
	// aws-nitro-tpm's opt-in lives in hardware.json: without it the record is refused.
	_, _, err := readConfig(writeRecord(t, att, true))
	assert.ErrorContains(t, err, "acceptUnauthenticatedAK: required")

	att = choose.Reference{Variant: variant.AzureTrustedLaunch, Values: choose.Values{Measurements: measurements.ReferenceSets{{Name: "image-v1", Measurements: measurementstest.Image(variant.AzureTrustedLaunch, nil)}}}}
	_, got, err := readConfig(writeRecord(t, att, true))
	require.NoError(t, err)
	assert.Equal(t, att, got)
}

// The service run as its DaemonSet runs it on an SEV-SNP record gets past its validator to
// its issuer, which needs the node's devices (absent here); a hardware block of another
// variant stops it before.
func TestRunBuildsHardwareValidator(t *testing.T) {
	sets := measurements.ReferenceSets{{Name: "image-v1", Measurements: measurementstest.Image(variant.AWSSEVSNP, nil)}}
	args := func(dir string) []string {
		return []string{"--api-server-endpoint=10.42.0.10:6443", "--config-dir=" + dir, "--tpm=unix:/nonexistent"}
	}
	dir := writeRecord(t, choose.Reference{Variant: variant.AWSSEVSNP, Values: choose.Values{Measurements: sets, HardwareValues: choose.HardwareValues{SNP: snpReference()}}}, false)
	err := run(context.Background(), args(dir), func(string) string { return "" }, io.Discard)
	require.Error(t, err)
	assert.ErrorContains(t, err, "TPM: issuer aws-sev-snp: opening the TPM")
	assert.NotContains(t, err.Error(), "attestation")

	tdxBlock, err := json.Marshal(choose.HardwareValues{SNP: snpReference(), TDX: tdxReference()})
	require.NoError(t, err)
	writeFile(t, dir, clusterrecord.HardwareKey, tdxBlock)
	err = run(context.Background(), args(dir), func(string) string { return "" }, io.Discard)
	assert.ErrorContains(t, err, "attestation configuration in "+dir)
	assert.ErrorContains(t, err, "tdx: aws-sev-snp evidence has no TD quote")
}
