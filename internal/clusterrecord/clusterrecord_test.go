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
	"github.com/openconstellation/constellation/internal/pki"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/measurements/measurementstest"
	"github.com/openconstellation/constellation/pkg/attestation/snp"
	"github.com/openconstellation/constellation/pkg/attestation/tdx"
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
		ClusterIDMarker: hex.EncodeToString(variant.QEMUVTPM.ClusterIDMarker(id)),
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
				c.ClusterIDMarker = hex.EncodeToString(variant.QEMUVTPM.ClusterIDMarker(make([]byte, 32)))
			},
			want: []string{"does not follow from the cluster ID"},
		},
		"component without hash": {mutate: func(c *clusterrecord.Cluster) { c.KubernetesComponents[0].Hash = "" }, want: []string{"kubernetes component 0"}},
		"unknown field ignored":  {mutate: func(*clusterrecord.Cluster) {}, extra: `,"addedLater":true`},
		// One reading only: a field twice or in another letter case is no newer init's field.
		"field twice":         {mutate: func(*clusterrecord.Cluster) {}, extra: `,"name":"other"`, want: []string{`duplicate member name "name"`}},
		"field in other case": {mutate: func(*clusterrecord.Cluster) {}, extra: `,"Name":"other"`, want: []string{"letter case"}},
		"oversized":           {raw: strings.Repeat(" ", clusterrecord.MaxSize+1), want: []string{"limit"}},
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
	a := choose.Reference{Variant: variant.QEMUVTPM, Values: choose.Values{Measurements: sets, AKRoots: string(rootPEM)}}
	data, err := clusterrecord.AttestationData(a)
	require.NoError(t, err)
	assert.Equal(t, "qemu-vtpm", data[clusterrecord.VariantKey])
	assert.JSONEq(t, "{}", data[clusterrecord.HardwareKey])
	got, err := clusterrecord.ParseAttestation([]byte(data[clusterrecord.VariantKey]+"\n"), []byte(data[clusterrecord.ReferenceSetsKey]), []byte(data[clusterrecord.AKRootsKey]), []byte(data[clusterrecord.HardwareKey]))
	require.NoError(t, err)
	assert.Equal(t, a, got)
	// A record written before hardware.json existed.
	got, err = clusterrecord.ParseAttestation([]byte(data[clusterrecord.VariantKey]), []byte(data[clusterrecord.ReferenceSetsKey]), []byte(data[clusterrecord.AKRootsKey]), nil)
	require.NoError(t, err)
	assert.Equal(t, a, got)

	leaf := ca.Certificate()
	notCA, _, err := mustCA(t).NewLeaf(pki.Leaf{CommonName: "leaf", Server: true, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	keyPEM, err := pki.EncodeKey(mustCA(t).Key)
	require.NoError(t, err)
	for name, tc := range map[string]struct {
		a    choose.Reference
		want []string
	}{
		"no variant":              {a: choose.Reference{Values: choose.Values{Measurements: sets, AKRoots: string(rootPEM)}}, want: []string{"no attestation variant"}},
		"no sets":                 {a: choose.Reference{Variant: variant.QEMUVTPM, Values: choose.Values{AKRoots: string(rootPEM)}}, want: []string{"measurements: at least one reference-value set is required"}},
		"root is a leaf":          {a: choose.Reference{Variant: variant.QEMUVTPM, Values: choose.Values{Measurements: sets, AKRoots: string(pki.EncodeCert(notCA))}}, want: []string{"is not a CA certificate"}},
		"a key among the roots":   {a: choose.Reference{Variant: variant.QEMUVTPM, Values: choose.Values{Measurements: sets, AKRoots: string(append(pki.EncodeCert(leaf), keyPEM...))}}, want: []string{"PEM block 2 is a"}},
		"garbage after roots":     {a: choose.Reference{Variant: variant.QEMUVTPM, Values: choose.Values{Measurements: sets, AKRoots: string(append(bytes.Clone(rootPEM), "junk"...))}}, want: []string{"not PEM after certificate 1"}},
		"qemu-vtpm without roots": {a: choose.Reference{Variant: variant.QEMUVTPM, Values: choose.Values{Measurements: sets}}, want: []string{"akRoots: no certificate"}},
		"hardware block on qemu-vtpm": {
			a:    choose.Reference{Variant: variant.QEMUVTPM, Values: choose.Values{Measurements: sets, AKRoots: string(rootPEM), HardwareValues: choose.HardwareValues{SNP: snpReference()}}},
			want: []string{"snp: qemu-vtpm evidence has no SEV-SNP report"},
		},
		"opt-in on qemu-vtpm": {
			a:    choose.Reference{Variant: variant.QEMUVTPM, Values: choose.Values{Measurements: sets, AKRoots: string(rootPEM), HardwareValues: choose.HardwareValues{AcceptUnauthenticatedAK: true}}},
			want: []string{"acceptUnauthenticatedAK"},
		},
		"snp variant without its block": {
			a:    choose.Reference{Variant: variant.AWSSEVSNP, Values: choose.Values{Measurements: snpSets()}},
			want: []string{"snp: required"},
		},
		"tdx block on an snp variant": {
			a:    choose.Reference{Variant: variant.AWSSEVSNP, Values: choose.Values{Measurements: snpSets(), HardwareValues: choose.HardwareValues{SNP: snpReference(), TDX: tdxReference()}}},
			want: []string{"tdx: aws-sev-snp evidence has no TD quote"},
		},
		"bad roots on a variant that needs none": {
			a:    choose.Reference{Variant: variant.AWSSEVSNP, Values: choose.Values{Measurements: snpSets(), AKRoots: string([]byte("junk")), HardwareValues: choose.HardwareValues{SNP: snpReference()}}},
			want: []string{"akRoots"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := clusterrecord.AttestationData(tc.a)
			for _, w := range tc.want {
				assert.ErrorContains(t, err, w)
			}
		})
	}
	_, err = clusterrecord.ParseAttestation([]byte("tpm-9000"), []byte(data[clusterrecord.ReferenceSetsKey]), rootPEM, nil)
	assert.ErrorContains(t, err, `unknown attestation variant "tpm-9000"`)
	_, err = clusterrecord.ParseAttestation([]byte("qemu-vtpm"), []byte(`[{"name":"x","measurements":{"99":{"expected":"00"}}}]`), rootPEM, nil)
	assert.Error(t, err)
}

func snpSets() measurements.ReferenceSets {
	return measurements.ReferenceSets{{Name: "image-v1", Measurements: measurementstest.Image(variant.AWSSEVSNP, map[uint32][]byte{4: bytes.Repeat([]byte{4}, 32)})}}
}

func tdxSets() measurements.ReferenceSets {
	return measurements.ReferenceSets{{Name: "image-v1", Measurements: measurementstest.Image(variant.QEMUTDX, nil)}}
}

// snpReference and tdxReference are valid hardware blocks, as pkg/attestation/choose's
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

// The whole reference of a hardware variant survives the ConfigMap: what the join service
// builds its validator from is what the CLI verified the first node with.
func TestAttestationHardwareRoundTrip(t *testing.T) {
	for name, a := range map[string]choose.Reference{
		"aws-sev-snp": {Variant: variant.AWSSEVSNP, Values: choose.Values{Measurements: snpSets(), HardwareValues: choose.HardwareValues{SNP: snpReference()}}},
		"qemu-tdx":    {Variant: variant.QEMUTDX, Values: choose.Values{Measurements: tdxSets(), HardwareValues: choose.HardwareValues{TDX: tdxReference()}}},
		"aws-nitro-tpm": {Variant: variant.AWSNitroTPM, Values: choose.Values{Measurements: measurements.ReferenceSets{{Name: "image-v1", Measurements: measurementstest.Image(variant.AWSNitroTPM, nil)}},
			HardwareValues: choose.HardwareValues{AcceptUnauthenticatedAK: true}}},
	} {
		t.Run(name, func(t *testing.T) {
			data, err := clusterrecord.AttestationData(a)
			require.NoError(t, err)
			got, err := clusterrecord.ParseAttestation([]byte(data[clusterrecord.VariantKey]), []byte(data[clusterrecord.ReferenceSetsKey]), []byte(data[clusterrecord.AKRootsKey]), []byte(data[clusterrecord.HardwareKey]))
			require.NoError(t, err)
			assert.Equal(t, a, got)
			require.NoError(t, got.ValidateForCluster())

			// Without its hardware.json (a record of an older init) the variant is refused.
			_, err = clusterrecord.ParseAttestation([]byte(data[clusterrecord.VariantKey]), []byte(data[clusterrecord.ReferenceSetsKey]), []byte(data[clusterrecord.AKRootsKey]), nil)
			assert.Error(t, err)
		})
	}
}

func TestParseHardwareRefuses(t *testing.T) {
	snpJSON, err := json.Marshal(snpReference())
	require.NoError(t, err)
	sets, err := json.Marshal(snpSets())
	require.NoError(t, err)
	for name, tc := range map[string]struct {
		data string
		want string
	}{
		"not JSON":             {data: `snp`, want: "hardware.json: invalid character"},
		"not an object":        {data: `[]`, want: "hardware.json: json: cannot unmarshal array"},
		"unknown field":        {data: `{"sev":{}}`, want: `hardware.json: unknown field "sev"`},
		"unknown field in snp": {data: `{"snp":{"minimumTCBs":{}}}`, want: `hardware.json: unknown field "minimumTCBs" in "/snp"`},
		"unknown field in tdx": {data: `{"tdx":{"mrSeams":[]}}`, want: "hardware.json"},
		"measurements":         {data: `{"snp":` + string(snpJSON) + `,"measurements":[]}`, want: `hardware.json: "measurements" is not a hardware value (it has its own key, reference-sets.json)`},
		"AK roots":             {data: `{"akRoots":""}`, want: `hardware.json: "akRoots" is not a hardware value (it has its own key, ak-roots.pem)`},
		"two objects":          {data: `{} {}`, want: "hardware.json: data after the JSON value"},
		"oversized":            {data: strings.Repeat(" ", clusterrecord.MaxSize+1), want: "hardware.json: 1048577 bytes, limit"},
	} {
		t.Run(name, func(t *testing.T) {
			// The error names the key.
			_, err = clusterrecord.ParseAttestation([]byte("aws-sev-snp"), sets, nil, []byte(tc.data))
			assert.ErrorContains(t, err, tc.want)
		})
	}
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
	sets, err := json.Marshal(measurements.ReferenceSets{{Name: "image-v1", Measurements: measurementstest.Image(variant.QEMUVTPM, nil)}})
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, cluster, roots []byte) {
		if c, err := clusterrecord.ParseCluster(cluster); err == nil {
			assert.Len(t, c.ID(), 32)
			assert.NotEmpty(t, c.Salt())
		}
		if ref, err := clusterrecord.ParseAttestation([]byte("qemu-vtpm"), sets, roots, nil); err == nil {
			assert.NotEmpty(t, strings.TrimSpace(ref.AKRoots), "a qemu-vtpm record needs AK roots")
		}
	})
}
