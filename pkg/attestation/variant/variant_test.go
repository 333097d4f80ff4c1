package variant

import (
	"encoding/json"
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
