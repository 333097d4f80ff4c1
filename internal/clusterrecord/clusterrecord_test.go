package clusterrecord_test

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/attestation/akca"
	"github.com/openconstellation/constellation/internal/clusterrecord"
	"github.com/openconstellation/constellation/internal/kms"
	"github.com/openconstellation/constellation/internal/pki"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/measurements/measurementstest"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

func record() clusterrecord.Cluster {
	id := bytes.Repeat([]byte{0xc1}, 32)
	return clusterrecord.Cluster{
		Name: "demo", ClusterID: hex.EncodeToString(id),
		MeasurementSalt:   base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0x42}, 32)),
		KubernetesVersion: "v1.34.4",
		KubernetesComponents: []clusterrecord.Component{
			{Name: "kubelet", URL: "file:///opt/kube/kubelet", Hash: "sha256:" + strings.Repeat("ab", 32), InstallPath: "/usr/bin/kubelet"},
		},
		InitializedPCR15: hex.EncodeToString(kms.InitializedPCR15(id)),
	}
}

func TestParseCluster(t *testing.T) {
	for name, tc := range map[string]struct {
		mutate func(*clusterrecord.Cluster)
		raw    string
		extra  string // appended to the encoded record's fields
		want   []string
	}{
		"genuine":          {mutate: func(*clusterrecord.Cluster) {}},
		"empty":            {raw: `{}`, want: []string{"no name", "cluster ID", "measurement salt", "kubernetes version"}},
		"not JSON":         {raw: `cluster`, want: []string{"decoding cluster record"}},
		"short cluster ID": {mutate: func(c *clusterrecord.Cluster) { c.ClusterID = "abcd" }, want: []string{`cluster ID "abcd" is not 32 bytes`}},
		"salt not base64":  {mutate: func(c *clusterrecord.Cluster) { c.MeasurementSalt = "!!" }, want: []string{"measurement salt"}},
		"marker of another cluster": {
			mutate: func(c *clusterrecord.Cluster) {
				c.InitializedPCR15 = hex.EncodeToString(kms.InitializedPCR15(make([]byte, 32)))
			},
			want: []string{"does not follow from the cluster ID"},
		},
		"component without hash": {mutate: func(c *clusterrecord.Cluster) { c.KubernetesComponents[0].Hash = "" }, want: []string{"kubernetes component 0"}},
		"unknown field ignored":  {mutate: func(*clusterrecord.Cluster) {}, extra: `,"addedLater":true`},
		"oversized":              {raw: strings.Repeat(" ", clusterrecord.MaxSize+1), want: []string{"limit"}},
	} {
		t.Run(name, func(t *testing.T) {
			data := []byte(tc.raw)
			want := record()
			if tc.mutate != nil {
				tc.mutate(&want)
				var err error
				data, err = json.Marshal(want)
				require.NoError(t, err)
				data = append(data[:len(data)-1], []byte(tc.extra+"}")...)
			}
			got, err := clusterrecord.ParseCluster(data)
			if len(tc.want) == 0 {
				require.NoError(t, err)
				assert.Equal(t, want, got)
				assert.Equal(t, bytes.Repeat([]byte{0x42}, 32), got.Salt())
				assert.Equal(t, bytes.Repeat([]byte{0xc1}, 32), got.ID())
				return
			}
			for _, w := range tc.want {
				assert.ErrorContains(t, err, w)
			}
		})
	}
}

func TestAttestation(t *testing.T) {
	ca, err := akca.New("local AK CA", time.Now(), time.Hour)
	require.NoError(t, err)
	rootPEM := pki.EncodeCert(ca.Certificate())
	sets := measurements.ReferenceSets{{Name: "image-v1", Measurements: measurementstest.Image(variant.QEMUVTPM, map[uint32][]byte{11: bytes.Repeat([]byte{1}, 32)})}}
	a := clusterrecord.Attestation{Variant: variant.QEMUVTPM, ReferenceSets: sets, AKRootsPEM: rootPEM}
	data, err := a.Data()
	require.NoError(t, err)
	assert.Equal(t, "qemu-vtpm", data[clusterrecord.VariantKey])
	got, err := clusterrecord.ParseAttestation([]byte(data[clusterrecord.VariantKey]+"\n"), []byte(data[clusterrecord.ReferenceSetsKey]), []byte(data[clusterrecord.AKRootsKey]))
	require.NoError(t, err)
	assert.Equal(t, a, got)

	leaf := ca.Certificate()
	notCA, _, err := mustCA(t).NewLeaf(pki.Leaf{CommonName: "leaf", Server: true, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	keyPEM, err := pki.EncodeKey(mustCA(t).Key)
	require.NoError(t, err)
	for name, tc := range map[string]struct {
		a    clusterrecord.Attestation
		want []string
	}{
		"no variant, no roots":  {a: clusterrecord.Attestation{ReferenceSets: sets}, want: []string{"no attestation variant", "AK roots: no certificate"}},
		"no sets":               {a: clusterrecord.Attestation{Variant: variant.QEMUVTPM, AKRootsPEM: rootPEM}, want: []string{"no reference-value set"}},
		"root is a leaf":        {a: clusterrecord.Attestation{Variant: variant.QEMUVTPM, ReferenceSets: sets, AKRootsPEM: pki.EncodeCert(notCA)}, want: []string{"is not a CA certificate"}},
		"a key among the roots": {a: clusterrecord.Attestation{Variant: variant.QEMUVTPM, ReferenceSets: sets, AKRootsPEM: append(pki.EncodeCert(leaf), keyPEM...)}, want: []string{"PEM block 2 is a"}},
		"garbage after roots":   {a: clusterrecord.Attestation{Variant: variant.QEMUVTPM, ReferenceSets: sets, AKRootsPEM: append(bytes.Clone(rootPEM), "junk"...)}, want: []string{"not PEM after certificate 1"}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := tc.a.Data()
			for _, w := range tc.want {
				assert.ErrorContains(t, err, w)
			}
		})
	}
	_, err = clusterrecord.ParseAttestation([]byte("tpm-9000"), []byte(data[clusterrecord.ReferenceSetsKey]), rootPEM)
	assert.ErrorContains(t, err, `unknown attestation variant "tpm-9000"`)
	_, err = clusterrecord.ParseAttestation([]byte("qemu-vtpm"), []byte(`[{"name":"x","measurements":{"99":{"expected":"00"}}}]`), rootPEM)
	assert.Error(t, err)
}

func mustCA(t *testing.T) *pki.CA {
	t.Helper()
	ca, err := pki.NewCA("test", time.Now(), time.Hour)
	require.NoError(t, err)
	return ca
}

func FuzzParseRecords(f *testing.F) {
	rec, err := json.Marshal(record())
	require.NoError(f, err)
	ca, err := akca.New("local AK CA", time.Now(), time.Hour)
	require.NoError(f, err)
	f.Add(rec, pki.EncodeCert(ca.Certificate()))
	f.Add([]byte(`{}`), []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"))
	f.Add([]byte(`null`), []byte(""))
	f.Fuzz(func(t *testing.T, cluster, roots []byte) {
		if c, err := clusterrecord.ParseCluster(cluster); err == nil {
			assert.Len(t, c.ID(), 32)
			assert.NotEmpty(t, c.Salt())
		}
		if pool, err := clusterrecord.ParseAKRoots(roots); err == nil {
			assert.NotNil(t, pool)
		}
	})
}
