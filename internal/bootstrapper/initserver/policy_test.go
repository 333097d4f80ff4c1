package initserver_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/openconstellation/constellation/internal/attestation/softfirmware"
	"github.com/openconstellation/constellation/internal/bootstrapper/bootstraptest"
	"github.com/openconstellation/constellation/internal/pki"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/measurements/measurementstest"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// looseReferenceSets are sets that admit more than the image, each with the register the
// refusal must name: what a CLI that holds the init secret (buggy, or an attacker's) could
// send so that the join service would later admit nodes that run something else.
func looseReferenceSets() map[string]measurementstest.Loose {
	return measurementstest.LooseSets(softfirmware.ExpectedPCRs(bootstraptest.Image))
}

// TestInitRefusesLooseReferenceSets: the node checks the attestation configuration of the
// init request (the one its join service will admit nodes by) with the same rule as the CLI,
// through the real request parsing, and refuses a loose set before it takes the node lock:
// nothing about the node changes.
func TestInitRefusesLooseReferenceSets(t *testing.T) {
	e := newEnv(t)
	for name, tc := range looseReferenceSets() {
		t.Run(name, func(t *testing.T) {
			req, _ := request(t)
			sets := measurements.ReferenceSets{
				{Name: "image", Measurements: softfirmware.ExpectedPCRs(bootstraptest.Image)},
				{Name: "loose", Measurements: tc.M},
			}
			setReference(t, req, choose.Reference{Variant: variant.QEMUVTPM, Values: choose.Values{Measurements: sets, AKRoots: string(pki.EncodeCert(e.ca.Certificate()))}})

			res := e.call(req)
			assert.Equal(t, codes.InvalidArgument, status.Code(res.Err), "%v", res.Err)
			assert.ErrorContains(t, res.Err, `attestation configuration: `)
			assert.ErrorContains(t, res.Err, `reference set "loose": `+tc.Want)
			assert.Empty(t, res.Progress)
		})
	}
	// Nothing happened: PCR 15 zero, lock free, storage fresh, kubeadm idle.
	assert.Equal(t, make([]byte, 32), e.node.ClusterIDRegister(t))
	assert.Empty(t, e.node.Node.LockHolder())
	initialized, err := e.node.Storage.Initialized()
	require.NoError(t, err)
	assert.False(t, initialized)
	assert.Empty(t, e.kubeadm.CallList())
}
