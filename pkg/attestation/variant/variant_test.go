package variant

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestVariantsAreComparableAndRoundTrip(t *testing.T) {
	seen := map[Variant]bool{}
	oids := map[string]bool{}
	for _, v := range All() {
		assert.False(t, seen[v], "duplicate variant %s", v)
		seen[v] = true
		assert.False(t, oids[v.OID().String()], "duplicate OID %s", v.OID())
		oids[v.OID().String()] = true

		byName, err := FromString(v.String())
		require.NoError(t, err)
		assert.True(t, byName == v, v.String())
		byOID, err := FromOID(v.OID())
		require.NoError(t, err)
		assert.True(t, byOID == v, v.String())

		js, err := json.Marshal(v)
		require.NoError(t, err)
		var back Variant
		require.NoError(t, json.Unmarshal(js, &back))
		assert.True(t, back == v, v.String())
	}
	assert.Len(t, seen, 9)
	assert.True(t, QEMUVTPM != AzureSEVSNP)
}

// The configuration keys are what users write in constellation-conf.yaml: they never change,
// and no two differ only in case (the configuration's "did you mean" hint folds case).
func TestConfigKeys(t *testing.T) {
	testCases := map[string]struct {
		v    Variant
		want string
	}{
		"qemu-vtpm":           {QEMUVTPM, "qemuVTPM"},
		"qemu-tdx":            {QEMUTDX, "qemuTDX"},
		"aws-sev-snp":         {AWSSEVSNP, "awsSEVSNP"},
		"aws-nitro-tpm":       {AWSNitroTPM, "awsNitroTPM"},
		"azure-sev-snp":       {AzureSEVSNP, "azureSEVSNP"},
		"azure-tdx":           {AzureTDX, "azureTDX"},
		"azure-trustedlaunch": {AzureTrustedLaunch, "azureTrustedLaunch"},
		"gcp-sev-es":          {GCPSEVES, "gcpSEVES"},
		"gcp-sev-snp":         {GCPSEVSNP, "gcpSEVSNP"},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, name, tc.v.String())
			assert.Equal(t, tc.want, tc.v.ConfigKey())
		})
	}
	assert.Len(t, testCases, len(All()), "every variant has its key pinned here")
	folded := map[string]Variant{}
	for _, v := range All() {
		k := strings.ToLower(v.ConfigKey())
		other, dup := folded[k]
		assert.False(t, dup, "%s and %s have the same configuration key up to case", v, other)
		folded[k] = v
	}
	assert.Empty(t, Variant{}.ConfigKey())
}

func TestUnknownVariant(t *testing.T) {
	_, err := FromString("azure-sev-snpp")
	assert.ErrorContains(t, err, `unknown attestation variant "azure-sev-snpp" (known: aws-nitro-tpm, aws-sev-snp`)
	var v Variant
	assert.Error(t, json.Unmarshal([]byte(`"qemu"`), &v))
	assert.True(t, v.IsZero())
}

// Every variant's cluster-ID register is a register of it outside its image registers, and
// its marker has the register's length.
func TestClusterIDRegisterAndMarker(t *testing.T) {
	id := []byte("cluster")
	for _, v := range All() {
		reg, ok := v.ClusterIDRegister()
		require.True(t, ok, v.String())
		assert.Less(t, reg, v.RegisterCount(), v.String())
		assert.NotContains(t, v.ImageRegisters(), reg, v.String())
		assert.Len(t, v.ClusterIDMarker(id), v.RegisterLen(), v.String())
	}
	_, ok := Variant{}.ClusterIDRegister()
	assert.False(t, ok)
	assert.Nil(t, Variant{}.ImageRegisters())
}
