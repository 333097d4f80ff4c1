package azure_test

import (
	"bytes"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/azure"
	"github.com/openconstellation/constellation/pkg/attestation/azure/azuretest"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
)

func readSample(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	require.NoError(t, err)
	return b
}

// snpHCLReport lays the real SNP sample out as the HCL report it came from: its file is the
// report and the real request data header, without the HCL header (which the builder adds).
func snpHCLReport(t testing.TB) []byte {
	att := readSample(t, "azure-snp-attestation.bin")
	runtime := readSample(t, "azure-snp-runtimedata.bin")
	out := azuretest.HCLReport(azure.ReportTypeSNP, att[:1184], runtime, 0)
	// The sample's own 20-byte request data header, not the builder's.
	require.Equal(t, att[1184:], out[1216:1236], "the builder lays the request header out as the real HCL does")
	return out
}

func TestRealTDXHCLReport(t *testing.T) {
	raw := readSample(t, "azure-tdx-hclreport.bin")
	r, err := azure.ParseHCLReport(raw)
	require.NoError(t, err)
	assert.Equal(t, azure.ReportTypeTDX, r.Type)
	assert.Len(t, r.HardwareReport, 1024)
	assert.Len(t, r.RuntimeData, 1200)
	assert.Equal(t, byte(0x81), r.HardwareReport[0], "TDREPORT type")

	// What the samples README states: SHA-256(runtime data) is REPORT_DATA[0:32], the rest zero.
	sum := sha256.Sum256(r.RuntimeData)
	assert.Equal(t, sum[:], r.ReportData()[:32])
	assert.Equal(t, make([]byte, 32), r.ReportData()[32:])
	require.NoError(t, r.CheckBinding())

	rd, err := azure.ParseRuntimeData(r.RuntimeData)
	require.NoError(t, err)
	require.NotNil(t, rd.EK)
	assert.Equal(t, 2048, rd.AK.N.BitLen())
	assert.Equal(t, 65537, rd.AK.E)
	assert.True(t, rd.VMConfig.SecureBoot)
	assert.True(t, rd.VMConfig.TPMEnabled)
	assert.Equal(t, "8C85CE00-A0EB-497B-87EF-CA9609E6C757", rd.VMConfig.VMUniqueID)
	assert.False(t, rd.AK.Equal(rd.EK))
}

func TestRealSNPBinding(t *testing.T) {
	att := readSample(t, "azure-snp-attestation.bin")
	runtime := readSample(t, "azure-snp-runtimedata.bin")
	// REPORT_DATA is at 0x50 of the SNP report: the hash of the runtime data, then zeros.
	require.NoError(t, azure.CheckBinding(att[0x50:0x90], runtime))

	r, err := azure.ParseHCLReport(snpHCLReport(t))
	require.NoError(t, err)
	assert.Equal(t, azure.ReportTypeSNP, r.Type)
	assert.Equal(t, att[:1184], r.HardwareReport)
	require.NoError(t, r.CheckBinding())

	rd, err := azure.ParseRuntimeData(runtime)
	require.NoError(t, err)
	assert.Nil(t, rd.EK, "this older runtime data lists the AK only")
	assert.True(t, strings.HasPrefix(azure.RSAJWK("", rd.AK)["n"].(string), "tyFqvAAAf2GF"), "keys[0] is the AK")
	assert.False(t, rd.VMConfig.SecureBoot)

	// One changed byte of runtime data (the "other VM" a forger would want) breaks the binding.
	edited := bytes.Replace(runtime, []byte(`"secure-boot":false`), []byte(`"secure-boot":true `), 1)
	require.NotEqual(t, runtime, edited)
	assert.ErrorIs(t, azure.CheckBinding(att[0x50:0x90], edited), attestation.ErrBadSignature)
	// Binding more than the runtime data (REPORT_DATA[32:64] not zero) is refused.
	rdata := bytes.Clone(att[0x50:0x90])
	rdata[63] ^= 1
	assert.ErrorIs(t, azure.CheckBinding(rdata, runtime), attestation.ErrBadSignature)
}

func TestParseHCLReportRejects(t *testing.T) {
	good := readSample(t, "azure-tdx-hclreport.bin")
	_, err := azure.ParseHCLReport(good)
	require.NoError(t, err)
	le := binary.LittleEndian
	edit := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	put := func(off int, v uint32) []byte {
		return edit(func(b []byte) []byte { le.PutUint32(b[off:], v); return b })
	}
	tests := map[string]struct {
		in   []byte
		want string
	}{
		"empty":                    {nil, "shorter than"},
		"headers only, truncated":  {good[:1235], "shorter than"},
		"runtime data truncated":   {good[:2435], "past the"},
		"signature":                {edit(func(b []byte) []byte { b[0] = 'X'; return b }), "signature"},
		"header version 0":         {put(4, 0), "header version 0, want 1 or 2"},
		"header version 3":         {put(4, 3), "header version 3"},
		"failed request status":    {put(16, 1), "status"},
		"report size":              {put(8, 2437), "report size"},
		"request data size":        {put(1216, 1219), "request data size"},
		"request version":          {put(1220, 2), "request data version"},
		"unknown report type":      {put(1224, 3), "report type 3"},
		"SHA-384 hash type":        {put(1228, 2), "hash type"},
		"runtime size zero":        {put(1232, 0), "runtime data size 0"},
		"runtime size huge":        {put(1232, 0xffffffff), "runtime data size"},
		"garbage after the report": {edit(func(b []byte) []byte { b[2500] = 1; return b }), "after the report's end"},
		"data after the TDREPORT":  {edit(func(b []byte) []byte { b[1100] = 1; return b }), "after the 1024-byte TDX report"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := azure.ParseHCLReport(tc.in)
			require.ErrorIs(t, err, attestation.ErrMalformed)
			assert.ErrorContains(t, err, tc.want)
		})
	}
}

// Reports of header version 1 (older Azure paravisors, Milan hosts) have the layout of version
// 2: the same report with either version parses to the same hardware report and runtime data.
func TestParseHCLReportVersions(t *testing.T) {
	good := readSample(t, "azure-tdx-hclreport.bin")
	want, err := azure.ParseHCLReport(good)
	require.NoError(t, err)
	for _, v := range []uint32{1, 2} {
		b := bytes.Clone(good)
		binary.LittleEndian.PutUint32(b[4:], v)
		got, err := azure.ParseHCLReport(b)
		require.NoError(t, err, "version %d", v)
		assert.Equal(t, want, got, "version %d", v)
	}
}

func TestBindingRejectsEditedRuntimeData(t *testing.T) {
	raw := readSample(t, "azure-tdx-hclreport.bin")
	// Change one byte of the runtime data: the report still parses, the binding does not hold.
	raw[1300] ^= 0x20
	r, err := azure.ParseHCLReport(raw)
	require.NoError(t, err)
	assert.ErrorIs(t, r.CheckBinding(), attestation.ErrBadSignature)
}

func TestParseRuntimeData(t *testing.T) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	n := azure.RSAJWK("", &key.PublicKey)["n"].(string)
	doc := func(keys string) []byte {
		return []byte(`{"keys":[` + keys + `],"vm-configuration":{"tpm-enabled":true}}`)
	}
	rsaKey := func(kid, n, e string) string {
		return `{"kid":"` + kid + `","kty":"RSA","n":"` + n + `","e":"` + e + `"}`
	}
	small, err := rsa.GenerateKey(rand.Reader, 1024)
	require.NoError(t, err)
	tests := map[string]struct {
		in      []byte
		wantErr string
	}{
		"AQAB exponent":                    {doc(rsaKey("HCLAkPub", n, "AQAB")), ""},
		"exponent with leading zero bytes": {doc(rsaKey("HCLAkPub", n, "AAEAAQ")), ""},
		"padded base64":                    {doc(rsaKey("HCLAkPub", n, "AQAB") + "," + rsaKey("HCLEkPub", n+"==", "AAEAAQ==")), ""},
		"unknown kid ignored":              {doc(rsaKey("Other", "!!", "") + "," + rsaKey("HCLAkPub", n, "AQAB")), ""},
		"no AK":                            {doc(rsaKey("HCLEkPub", n, "AQAB")), `no key "HCLAkPub"`},
		"AK twice":                         {doc(rsaKey("HCLAkPub", n, "AQAB") + "," + rsaKey("HCLAkPub", n, "AQAB")), "listed twice"},
		"EC key":                           {doc(`{"kid":"HCLAkPub","kty":"EC","n":"` + n + `","e":"AQAB"}`), "key type"},
		"small modulus":                    {doc(rsaKey("HCLAkPub", azure.RSAJWK("", &small.PublicKey)["n"].(string), "AQAB")), "1024 bits"},
		"even exponent":                    {doc(rsaKey("HCLAkPub", n, "AQAA")), "exponent"},
		"huge exponent":                    {doc(rsaKey("HCLAkPub", n, "AQAAAAAB")), "exponent"},
		"bad base64":                       {doc(rsaKey("HCLAkPub", "***", "AQAB")), "modulus"},
		"empty exponent":                   {doc(rsaKey("HCLAkPub", n, "")), "exponent"},
		"no vm-configuration":              {[]byte(`{"keys":[` + rsaKey("HCLAkPub", n, "AQAB") + `]}`), "vm-configuration"},
		"not JSON":                         {[]byte("HCLA"), "JSON"},
		"trailing garbage":                 {append(doc(rsaKey("HCLAkPub", n, "AQAB")), 'x'), "JSON"},
		// One reading only: the AK read here must be the one any reader of the signed runtime
		// data sees (encoding/json alone keeps the last of two fields, in any letter case).
		"keys twice":       {[]byte(`{"keys":[` + rsaKey("HCLAkPub", "AQAB", "AQAB") + `],"keys":[` + rsaKey("HCLAkPub", n, "AQAB") + `],"vm-configuration":{"tpm-enabled":true}}`), `duplicate member name "keys"`},
		"Keys beside keys": {[]byte(`{"keys":[` + rsaKey("HCLAkPub", "AQAB", "AQAB") + `],"Keys":[` + rsaKey("HCLAkPub", n, "AQAB") + `],"vm-configuration":{"tpm-enabled":true}}`), "letter case"},
		"N beside n":       {doc(`{"kid":"HCLAkPub","kty":"RSA","n":"AQAB","N":"` + n + `","e":"AQAB"}`), "letter case"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			rd, err := azure.ParseRuntimeData(tc.in)
			if tc.wantErr != "" {
				require.ErrorIs(t, err, attestation.ErrMalformed)
				assert.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			// Keys compare as keys: every encoding above is the same key.
			assert.True(t, rd.AK.Equal(&key.PublicKey))
			assert.NoError(t, rd.CheckAK(&key.PublicKey))
		})
	}
}

func TestCheckAKRejectsAnotherKey(t *testing.T) {
	rd, err := azure.ParseRuntimeData(readSample(t, "azure-snp-runtimedata.bin"))
	require.NoError(t, err)
	other, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	assert.ErrorIs(t, rd.CheckAK(&other.PublicKey), attestation.ErrUntrustedSigner)
	// Same modulus, another exponent: another key.
	sameN := &rsa.PublicKey{N: rd.AK.N, E: 3}
	assert.ErrorIs(t, rd.CheckAK(sameN), attestation.ErrUntrustedSigner)
	assert.ErrorIs(t, rd.CheckAK(nil), attestation.ErrUntrustedSigner)
	assert.NoError(t, rd.CheckAK(&rsa.PublicKey{N: rd.AK.N, E: rd.AK.E}))
}

func FuzzParseHCLReport(f *testing.F) {
	f.Add(readSample(f, "azure-tdx-hclreport.bin"))
	f.Add(snpHCLReport(f))
	f.Add([]byte("HCLA"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := azure.ParseHCLReport(b)
		if err != nil {
			require.ErrorIs(t, err, attestation.ErrMalformed)
			return
		}
		// What parses has the sizes the layout promises.
		require.Contains(t, []int{1184, 1024}, len(r.HardwareReport))
		require.Len(t, r.ReportData(), 64)
		_ = r.CheckBinding()
	})
}

func FuzzParseRuntimeData(f *testing.F) {
	f.Add(readSample(f, "azure-snp-runtimedata.bin"))
	tdx, err := azure.ParseHCLReport(readSample(f, "azure-tdx-hclreport.bin"))
	require.NoError(f, err)
	f.Add(tdx.RuntimeData)
	f.Add([]byte(`{"keys":[{"kid":"HCLAkPub","kty":"RSA","n":"AQAB","e":"AAEAAQ"}],"vm-configuration":{}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		rd, err := azure.ParseRuntimeData(b)
		if err != nil {
			require.ErrorIs(t, err, attestation.ErrMalformed)
			return
		}
		require.NotNil(t, rd.AK)
		require.GreaterOrEqual(t, rd.AK.N.BitLen(), 2048)
		require.NoError(t, rd.CheckAK(&rsa.PublicKey{N: rd.AK.N, E: rd.AK.E}))
	})
}

// TestAKPublic: the real runtime data's AK as a TPMT_PUBLIC decodes to the same key, passes
// the AK checks every validator applies, and a key of another size is refused.
func TestAKPublic(t *testing.T) {
	rd, err := azure.ParseRuntimeData(readSample(t, "azure-snp-runtimedata.bin"))
	require.NoError(t, err)
	area, err := rd.AKPublic()
	require.NoError(t, err)
	pub, err := tpm2.DecodePublic(area)
	require.NoError(t, err)
	key, err := vtpm.CheckAKAttributes(pub)
	require.NoError(t, err)
	require.NoError(t, rd.CheckAK(key))

	small, err := rsa.GenerateKey(rand.Reader, 1024)
	require.NoError(t, err)
	_, err = (&azure.RuntimeData{AK: &small.PublicKey}).AKPublic()
	assert.ErrorContains(t, err, "RSA-1024")
	_, err = (&azure.RuntimeData{}).AKPublic()
	assert.ErrorContains(t, err, "no AK")
}
