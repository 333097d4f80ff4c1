package verifyservice_test

import (
	"context"
	"crypto/sha256"
	"net"
	"testing"
	"time"

	"github.com/google/go-tpm-tools/simulator"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/attestation/akca"
	"github.com/openconstellation/constellation/internal/attestation/softfirmware"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider/local"
	"github.com/openconstellation/constellation/internal/verifyservice"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/qemu"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
	"github.com/openconstellation/constellation/pkg/verify"
)

// TestThirdPartyVerifiesNode: a third party, with pkg/verify alone, verifies a node measured
// like a local node behind the real verification service, with three values it trusts (from
// the cluster's operator, or read from kube-system/constellation-attestation and checked):
// the reference values of the node image, the platform's AK roots, and the cluster ID.
func TestThirdPartyVerifiesNode(t *testing.T) {
	node := startThirdPartyNode() // a node of a cluster, serving its verification service on loopback
	defer node.stop()

	ref := choose.Reference{
		Variant: variant.QEMUVTPM,
		Values: choose.Values{
			Measurements: measurements.ReferenceSets{{Name: "image-v1", Measurements: node.image}},
			AKRoots:      node.akRoots,
		},
	}
	validator, err := choose.NewValidator(ref, choose.Options{})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := verify.Verify(ctx, "worker-0", node.endpoint, validator, node.clusterID)
	require.NoError(t, err)
	assert.Equal(t, variant.QEMUVTPM.String(), res.Variant)
	assert.Equal(t, "image-v1", res.ReferenceSet)
	assert.Equal(t, "worker-0", res.Signer.Name)
	assert.True(t, res.Signer.Certified)
	assert.True(t, res.ClusterID.Match)
}

// thirdPartyNode is what the test verifies: a simulated TPM measured like a local node, its
// AK certified by a platform CA, initialized for a cluster, behind a verification service.
type thirdPartyNode struct {
	endpoint  string
	akRoots   string
	image     measurements.M
	clusterID []byte
	stop      func()
}

func startThirdPartyNode() *thirdPartyNode {
	must := func(err error) {
		if err != nil {
			panic(err)
		}
	}
	sim, err := simulator.Get()
	must(err)
	tpm := vtpm.New(sim, "simulator")
	image := []softfirmware.Component{softfirmware.BytesComponent("bootstrapper", local.PCRBootstrapper, []byte("bootstrapper v1"))}
	bootLog, err := softfirmware.MeasureLogged(tpm, image)
	must(err)
	ca, err := akca.New("example platform AK CA", time.Now(), time.Hour)
	must(err)
	must(softfirmware.CertifyAK(tpm, ca, "worker-0", metadata.Worker, time.Now()))
	clusterID := []byte("example cluster id, 32 bytes....")
	digest := sha256.Sum256(clusterID)
	must(tpm.ExtendPCR(15, digest[:]))
	iss, err := qemu.NewIssuer(tpm, nil, func() ([]byte, error) { return bootLog, nil })
	must(err)
	srv, err := verifyservice.New(verifyservice.Config{Issuer: iss})
	must(err)
	g := srv.NewGRPCServer()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(err)
	go func() { _ = g.Serve(ln) }()
	caPEM, _, err := ca.PEM()
	must(err)
	return &thirdPartyNode{
		endpoint: ln.Addr().String(), akRoots: string(caPEM), image: softfirmware.ExpectedPCRs(image), clusterID: clusterID,
		stop: func() { g.Stop(); _ = tpm.Close() },
	}
}
