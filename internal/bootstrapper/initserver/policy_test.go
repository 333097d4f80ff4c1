package initserver_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/openconstellation/constellation/internal/attestation/measurements"
	"github.com/openconstellation/constellation/internal/attestation/variant"
	"github.com/openconstellation/constellation/internal/bootstrapper/bootstraptest"
	"github.com/openconstellation/constellation/internal/pki"
	"github.com/openconstellation/constellation/internal/provider/local"
)

// looseReferenceSets are sets that admit more than the image, each with the register the
// refusal must name: what a CLI that holds the init secret (buggy, or an attacker's) could
// send so that the join service would later admit nodes that run something else.
func looseReferenceSets() map[string]struct {
	m    measurements.M
	want string
} {
	image := local.ExpectedPCRs(bootstraptest.Image)
	with := func(i uint32, meas measurements.Measurement) measurements.M {
		m := measurements.M{}
		for k, v := range image {
			m[k] = v
		}
		m[i] = meas
		return m
	}
	zero := make([]byte, 32)
	return map[string]struct {
		m    measurements.M
		want string
	}{
		"only PCR 0 enforced":                   {measurements.M{0: image[0]}, "missing PCR 1, PCR 2"},
		"only software-resettable PCRs 16, 23":  {measurements.M{16: {Expected: zero}, 23: {Expected: zero}}, "PCR 16, PCR 23 not measured by the image"},
		"bootstrapper PCR 11 warn-only":         {with(11, measurements.Measurement{Expected: bytes.Repeat([]byte{0xab}, 32), WarnOnly: true}), "PCR 11 warn-only"},
		"PCR 15 pinned to zero (uninitialized)": {with(15, measurements.Measurement{Expected: zero}), "PCR 15 must not be in a reference set"},
	}
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
				{Name: "image", Measurements: local.ExpectedPCRs(bootstraptest.Image)},
				{Name: "loose", Measurements: tc.m},
			}
			// Encoded by hand: clusterrecord.Attestation.Data would refuse to encode it.
			data, err := json.Marshal(sets)
			require.NoError(t, err)
			req.AttestationVariant, req.ReferenceSets, req.AkRoots = variant.QEMUVTPM.String(), data, pki.EncodeCert(e.ca.Certificate())

			res := e.call(req)
			assert.Equal(t, codes.InvalidArgument, status.Code(res.Err), "%v", res.Err)
			assert.ErrorContains(t, res.Err, `attestation configuration: `)
			assert.ErrorContains(t, res.Err, `reference set "loose": `+tc.want)
			assert.Empty(t, res.Progress)
		})
	}
	// Nothing happened: PCR 15 zero, lock free, storage fresh, kubeadm idle.
	assert.Equal(t, make([]byte, 32), e.node.PCR15(t))
	assert.Empty(t, e.node.Node.LockHolder())
	initialized, err := e.node.Storage.Initialized()
	require.NoError(t, err)
	assert.False(t, initialized)
	assert.Empty(t, e.kubeadm.CallList())
}
