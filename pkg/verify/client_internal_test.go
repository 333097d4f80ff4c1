package verify

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/tdx"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// The cluster marker is compared in the variant's own register and hash: PCR 15 (SHA-256)
// for vTPM variants, RTMR3 (SHA-384) for qemu-tdx.
func TestCheckClusterIDPerVariant(t *testing.T) {
	id := bytes.Repeat([]byte{0xc1}, 32)
	other := bytes.Repeat([]byte{0x0c}, 32)
	for name, tc := range map[string]struct {
		v     variant.Variant
		reg   uint32
		value []byte
		match bool
	}{
		"vtpm marker":            {variant.QEMUVTPM, 15, attestation.ClusterIDMarker(id), true},
		"vtpm other cluster":     {variant.QEMUVTPM, 15, attestation.ClusterIDMarker(other), false},
		"vtpm not initialized":   {variant.AzureSEVSNP, 15, make([]byte, 32), false},
		"tdx marker":             {variant.QEMUTDX, tdx.RegisterClusterID, tdx.ClusterIDMarker(id), true},
		"tdx with a vtpm marker": {variant.QEMUTDX, tdx.RegisterClusterID, attestation.ClusterIDMarker(id), false},
	} {
		got := checkClusterID(&attestation.Verified{Variant: tc.v, Registers: map[uint32][]byte{tc.reg: tc.value}}, id)
		assert.Equal(t, tc.match, got.Match, name)
	}
	assert.Len(t, variant.ClusterIDMarkerOf(48, id), 48)
	assert.Nil(t, variant.ClusterIDMarkerOf(20, id))
}
