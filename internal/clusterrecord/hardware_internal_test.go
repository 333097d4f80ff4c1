package clusterrecord

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/snp"
)

// TestParseHardwareEmpty: blank hardware.json is no hardware block.
func TestParseHardwareEmpty(t *testing.T) {
	h, err := parseHardware([]byte(" \n"))
	require.NoError(t, err)
	assert.Equal(t, choose.HardwareValues{}, h)
}

func FuzzParseHardware(f *testing.F) {
	ref := snp.DefaultReference("milan-2025")
	ref.Products = []string{"Milan"}
	ref.Measurements = snp.Digests{bytes.Repeat([]byte{1}, 48)}
	snpJSON, err := json.Marshal(choose.HardwareValues{SNP: &ref})
	require.NoError(f, err)
	f.Add(snpJSON)
	f.Add([]byte(`{"tdx":{"name":"tdx-1.5","mrSeam":[]}}`))
	f.Add([]byte(`{"acceptUnauthenticatedAK":true}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"measurements":[]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := parseHardware(data)
		if err != nil {
			return
		}
		// What parses re-encodes to what parses and encodes the same (Data writes what
		// ParseAttestation reads).
		again, err := json.Marshal(h)
		require.NoError(t, err)
		h2, err := parseHardware(again)
		require.NoError(t, err)
		twice, err := json.Marshal(h2)
		require.NoError(t, err)
		assert.Equal(t, string(again), string(twice))
	})
}
