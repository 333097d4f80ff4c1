package cli

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/clusterrecord"
	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/measurements/measurementstest"
	"github.com/openconstellation/constellation/pkg/attestation/snp"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// attestingPlatform is a platform whose nodes attest with att (nothing else of it is used).
type attestingPlatform struct {
	provider.Provider
	att provider.Attestation
}

func (p attestingPlatform) Attestation(context.Context) (provider.Attestation, error) {
	return p.att, nil
}

// What the CLI sends with init (and the first node records for the join service) is the
// whole configured reference, hardware block included: the join service of an SEV-SNP
// cluster builds its validator from it.
func TestClusterAttestationCarriesTheHardwareBlock(t *testing.T) {
	ref := snp.DefaultReference("milan-2025")
	ref.Products = []string{"Milan"}
	ref.MinimumTCB = map[string]snp.TCB{"Milan": {Bootloader: 3, TEE: 0, SNP: 8, Microcode: 115}}
	ref.Measurements = snp.Digests{bytes.Repeat([]byte{1}, 48)}
	sets := measurements.ReferenceSets{{Name: "image-v1", Measurements: measurementstest.Image(variant.AWSSEVSNP, nil)}}
	conf := &config.Config{Attestation: config.AttestationFor(variant.AWSSEVSNP, config.VariantConfig{Measurements: sets, HardwareValues: choose.HardwareValues{SNP: &ref}})}

	attest, validator, err := clusterAttestation(context.Background(), attestingPlatform{att: provider.Attestation{Variant: variant.AWSSEVSNP}}, conf)
	require.NoError(t, err)
	assert.Equal(t, variant.AWSSEVSNP, validator.Variant())
	assert.Equal(t, &ref, attest.SNP)

	// Through the init request's encoding, then the record's, as the init server writes it
	// and the join service reads it.
	encoded, err := attest.Encode()
	require.NoError(t, err)
	sent, err := choose.DecodeReference(encoded)
	require.NoError(t, err)
	data, err := clusterrecord.AttestationData(sent)
	require.NoError(t, err)
	got, err := clusterrecord.ParseAttestation([]byte(data[clusterrecord.VariantKey]), []byte(data[clusterrecord.ReferenceSetsKey]),
		[]byte(data[clusterrecord.AKRootsKey]), []byte(data[clusterrecord.HardwareKey]))
	require.NoError(t, err)
	want, err := conf.Attestation.Reference()
	require.NoError(t, err)
	assert.Equal(t, want, got)

	// The platform's variant must be the configured one.
	_, _, err = clusterAttestation(context.Background(), attestingPlatform{att: provider.Attestation{Variant: variant.QEMUVTPM}}, conf)
	assert.ErrorContains(t, err, "the platform's nodes attest with qemu-vtpm")
}
