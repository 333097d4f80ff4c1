package verify_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net"
	"time"

	"github.com/google/go-tpm-tools/simulator"
	"google.golang.org/grpc"

	"github.com/openconstellation/constellation/pkg/api/verify/verifypb"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/qemu"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/vtpmtest"
	"github.com/openconstellation/constellation/pkg/verify"
)

// A third party verifies a node of a cluster with three values it trusts (from the cluster's
// operator, or read from kube-system/constellation-attestation and checked): the reference
// values of the node image, the platform's AK roots, and the cluster ID. Nothing else the node
// or the network says is trusted.
func Example() {
	node, err := startNode() // a node of a cluster, serving its verification service on loopback
	if err != nil {
		fmt.Println(err)
		return
	}
	defer node.stop()

	ref := choose.Reference{
		Variant: variant.QEMUVTPM,
		Values: choose.Values{
			Measurements: measurements.ReferenceSets{{Name: "image-v1", Measurements: node.image}},
			AKRoots:      node.akRoots,
		},
	}
	validator, err := choose.NewValidator(ref, choose.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := verify.Verify(ctx, "worker-0", node.endpoint, validator, node.clusterID)
	if err != nil {
		fmt.Println("not verified:", err)
		return
	}
	fmt.Println("variant:", res.Variant)
	fmt.Println("reference set:", res.ReferenceSet)
	fmt.Println("signed by:", res.Signer.Name, "certified:", res.Signer.Certified)
	fmt.Println("member of the cluster:", res.ClusterID.Match)
	// Output:
	// variant: qemu-vtpm
	// reference set: image-v1
	// signed by: worker-0 certified: true
	// member of the cluster: true
}

// exampleNode is what the example verifies: a simulated TPM booted with an event log, its AK
// certified by a platform CA, initialized for a cluster, behind a minimal verification
// service (the cluster's own is internal/verifyservice, which adds admission limits).
type exampleNode struct {
	endpoint  string
	akRoots   string
	image     measurements.M
	clusterID []byte
	stop      func()
}

func startNode() (*exampleNode, error) {
	sim, err := simulator.Get()
	if err != nil {
		return nil, err
	}
	tpm := vtpm.New(sim, "simulator")
	node, err := bootNode(tpm)
	if err != nil {
		_ = tpm.Close()
		return nil, err
	}
	return node, nil
}

func bootNode(tpm *vtpm.TPM) (*exampleNode, error) {
	// Firmware and boot loader measure the image into PCRs 0..14 and log it.
	image, log, err := vtpmtest.BootImage(tpm, variant.QEMUVTPM, "image v1")
	if err != nil {
		return nil, err
	}
	// The platform certifies the node's AK; the node joins a cluster (PCR 15).
	ca, err := vtpmtest.NewPlatformCA("example platform AK CA")
	if err != nil {
		return nil, err
	}
	uncertified, err := qemu.NewIssuer(tpm, nil, nil)
	if err != nil {
		return nil, err
	}
	cert, err := ca.CertifyNodeAK(uncertified.AKPublic(), "worker-0", attestation.RoleWorker, time.Now(), time.Hour)
	uncertified.Close()
	if err != nil {
		return nil, err
	}
	clusterID := []byte("example cluster id, 32 bytes....")
	digest := sha256.Sum256(clusterID)
	marker, _ := variant.QEMUVTPM.ClusterIDRegister()
	if err := tpm.ExtendPCR(int(marker), digest[:]); err != nil {
		return nil, err
	}
	iss, err := qemu.NewIssuer(tpm, cert, func() ([]byte, error) { return log, nil })
	if err != nil {
		return nil, err
	}
	g := grpc.NewServer()
	verifypb.RegisterVerificationServiceServer(g, &service{issuer: iss})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go func() { _ = g.Serve(ln) }()
	return &exampleNode{
		endpoint: ln.Addr().String(), akRoots: ca.PEM(), image: image, clusterID: clusterID,
		stop: func() { g.Stop(); iss.Close(); _ = tpm.Close() },
	}, nil
}

// service answers GetAttestation with evidence bound to the caller's nonce, for the
// verification service's purpose.
type service struct {
	verifypb.UnimplementedVerificationServiceServer
	issuer attestation.Issuer
}

func (s *service) GetAttestation(ctx context.Context, req *verifypb.GetAttestationRequest) (*verifypb.GetAttestationResponse, error) {
	evidence, err := s.issuer.Issue(ctx, attestation.PurposeVerify, req.GetNonce())
	if err != nil {
		return nil, err
	}
	return &verifypb.GetAttestationResponse{Evidence: evidence, Variant: s.issuer.Variant().String()}, nil
}
