package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/attestation/akca"
	"github.com/openconstellation/constellation/internal/attestation/softfirmware"
	"github.com/openconstellation/constellation/internal/clusterrecord"
	"github.com/openconstellation/constellation/internal/pki"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/measurements/measurementstest"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// TestRunRefusesLooseReferenceSets: whoever can write the attestation ConfigMap before the
// join service starts publishes a reference set that admits more than the image. The
// service refuses to start (it never admits a node by such a set), naming the set and the
// register. Updates while it runs are refused by the same rule (measurements.Watcher).
func TestRunRefusesLooseReferenceSets(t *testing.T) {
	ca, err := akca.New("local AK CA", time.Now(), time.Hour)
	require.NoError(t, err)
	clusterID := bytes.Repeat([]byte{7}, 32)
	record, err := json.Marshal(clusterrecord.Cluster{
		Name: "demo", ClusterID: hex.EncodeToString(clusterID), MeasurementSalt: base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0x42}, 32)),
		KubernetesVersion: "v1.34.4", ClusterIDMarker: hex.EncodeToString(variant.QEMUVTPM.ClusterIDMarker(clusterID)),
	})
	require.NoError(t, err)
	full := softfirmware.ExpectedPCRs(image)
	for name, tc := range measurementstest.LooseSets(full) {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			writeFile(t, dir, clusterrecord.ClusterKey, record)
			writeFile(t, dir, clusterrecord.VariantKey, []byte(variant.QEMUVTPM.String()))
			writeFile(t, dir, clusterrecord.AKRootsKey, pki.EncodeCert(ca.Certificate()))
			sets, err := json.Marshal(measurements.ReferenceSets{{Name: "image-v1", Measurements: full}, {Name: "loose", Measurements: tc.M}})
			require.NoError(t, err)
			writeFile(t, dir, clusterrecord.ReferenceSetsKey, sets)

			err = run(context.Background(), []string{"--api-server-endpoint=10.42.0.10:6443", "--config-dir=" + dir, "--tpm=unix:/nonexistent"}, func(string) string { return "" }, io.Discard)
			require.Error(t, err)
			assert.ErrorContains(t, err, "attestation configuration in "+dir)
			assert.ErrorContains(t, err, `reference set "loose": `+tc.Want)
		})
	}
}
