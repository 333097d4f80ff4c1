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
	"github.com/openconstellation/constellation/internal/attestation/measurements"
	"github.com/openconstellation/constellation/internal/attestation/variant"
	"github.com/openconstellation/constellation/internal/clusterrecord"
	"github.com/openconstellation/constellation/internal/kms"
	"github.com/openconstellation/constellation/internal/pki"
	"github.com/openconstellation/constellation/internal/provider/local"
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
		KubernetesVersion: "v1.34.4", InitializedPCR15: hex.EncodeToString(kms.InitializedPCR15(clusterID)),
	})
	require.NoError(t, err)
	full := local.ExpectedPCRs(image)
	with := func(i uint32, meas measurements.Measurement) measurements.M {
		m := measurements.M{}
		for k, v := range full {
			m[k] = v
		}
		m[i] = meas
		return m
	}
	zero := make([]byte, 32)
	for name, tc := range map[string]struct {
		m    measurements.M
		want string
	}{
		"only PCR 0 enforced":                  {measurements.M{0: full[0]}, "missing PCR 1, PCR 2"},
		"only software-resettable PCRs 16, 23": {measurements.M{16: {Expected: zero}, 23: {Expected: zero}}, "PCR 16, PCR 23 not measured by the image"},
		"bootstrapper PCR 11 warn-only":        {with(11, measurements.Measurement{Expected: zero, WarnOnly: true}), "PCR 11 warn-only"},
		"PCR 15 pinned to this cluster":        {with(15, measurements.Measurement{Expected: kms.InitializedPCR15(clusterID)}), "PCR 15 must not be in a reference set"},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			writeFile(t, dir, clusterrecord.ClusterKey, record)
			writeFile(t, dir, clusterrecord.VariantKey, []byte(variant.QEMUVTPM.String()))
			writeFile(t, dir, clusterrecord.AKRootsKey, pki.EncodeCert(ca.Certificate()))
			sets, err := json.Marshal(measurements.ReferenceSets{{Name: "image-v1", Measurements: full}, {Name: "loose", Measurements: tc.m}})
			require.NoError(t, err)
			writeFile(t, dir, clusterrecord.ReferenceSetsKey, sets)

			err = run(context.Background(), []string{"--api-server-endpoint=10.42.0.10:6443", "--config-dir=" + dir, "--tpm=unix:/nonexistent"}, func(string) string { return "" }, io.Discard)
			require.Error(t, err)
			assert.ErrorContains(t, err, "attestation configuration in "+dir)
			assert.ErrorContains(t, err, `reference set "loose": `+tc.want)
		})
	}
}
