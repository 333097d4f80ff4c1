package local_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/attestation/akca"
	"github.com/openconstellation/constellation/internal/attestation/softfirmware"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider/local"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/qemu"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/vtpmtest"
)

// TestOfflineMeasurementsMatchBoot: the reference values computed offline are exactly what a
// node that booted the image quotes, and a node with a different binary is told apart by PCR.
func TestOfflineMeasurementsMatchBoot(t *testing.T) {
	image := []softfirmware.Component{
		softfirmware.BytesComponent("bootstrapper", local.PCRBootstrapper, []byte("bootstrapper v1")),
		softfirmware.BytesComponent("node-config", local.PCRNodeConfig, []byte(`{"k8s":"v1.34.4"}`)),
	}
	tpm, _ := vtpmtest.Swtpm(t)
	bootLog, err := softfirmware.MeasureLogged(tpm, image)
	require.NoError(t, err)
	ca, err := akca.New("provider", time.Now(), time.Hour)
	require.NoError(t, err)
	require.NoError(t, softfirmware.CertifyAK(tpm, ca, "node-0", metadata.Worker, time.Now()))

	val, err := qemu.NewValidator(qemu.ValidatorConfig{
		ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: measurements.ReferenceSets{{Name: "image", Measurements: softfirmware.ExpectedPCRs(image)}}},
		AKRoots:         ca.Pool(),
	})
	require.NoError(t, err)
	nonce := make([]byte, 32)
	evidence := map[vtpm.AKAlgorithm][]byte{}
	for _, alg := range vtpm.AKAlgorithms {
		t.Run("AK "+alg.String(), func(t *testing.T) {
			iss, err := vtpm.NewIssuer(tpm, qemu.VTPMIssuerConfig(qemu.IssuerConfig{AK: alg, EventLog: func() ([]byte, error) { return bootLog, nil }}))
			require.NoError(t, err)
			t.Cleanup(func() { _ = iss.Close() })
			ev, err := iss.Issue(context.Background(), attestation.PurposeVerify, nonce)
			require.NoError(t, err)
			evidence[alg] = ev
			got, err := val.Validate(context.Background(), ev, attestation.PurposeVerify, nonce)
			require.NoError(t, err)
			assert.True(t, got.SignerCertified, "the provider certified the %s AK", alg)
			assert.Equal(t, "node-0", got.SignerName)
			assert.Equal(t, metadata.Worker, got.SignerRole, "the AK certificate carries the role the provider gave")
		})
	}
	require.NotEqual(t, evidence[vtpm.AKRSA], evidence[vtpm.AKECC])
	ev := evidence[vtpm.AKRSA]

	modified := append([]softfirmware.Component{softfirmware.BytesComponent("bootstrapper", local.PCRBootstrapper, []byte("bootstrapper v1 + backdoor"))}, image[1:]...)
	val, err = qemu.NewValidator(qemu.ValidatorConfig{
		ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: measurements.ReferenceSets{{Name: "modified", Measurements: softfirmware.ExpectedPCRs(modified)}}},
		AKRoots:         ca.Pool(),
	})
	require.NoError(t, err)
	_, err = val.Validate(context.Background(), ev, attestation.PurposeVerify, nonce)
	assert.ErrorContains(t, err, "PCR 11: expected")
}

// The local PCR map and the qemu-vtpm register map the policy rule checks against are one
// map: softfirmware.ExpectedPCRs covers exactly the image registers, the cluster-ID register is PCR 15
// (where init/join extend the marker), and generated reference values pass the rule.
func TestPCRMapIsTheVariantRegisterMap(t *testing.T) {
	m := softfirmware.ExpectedPCRs([]softfirmware.Component{softfirmware.BytesComponent("bootstrapper", local.PCRBootstrapper, []byte("b")), softfirmware.BytesComponent("config", local.PCRNodeConfig, []byte("c"))})
	assert.Equal(t, variant.QEMUVTPM.ImageRegisters(), m.Indices())
	assert.Contains(t, m.Indices(), uint32(local.PCRBootstrapper))
	assert.Contains(t, m.Indices(), uint32(local.PCRNodeConfig))
	id, ok := variant.QEMUVTPM.ClusterIDRegister()
	require.True(t, ok)
	assert.Equal(t, uint32(local.PCRClusterID), id)
	require.NoError(t, m.Validate(variant.QEMUVTPM))
}
