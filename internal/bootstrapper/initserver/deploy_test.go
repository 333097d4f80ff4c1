package initserver_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/openconstellation/constellation/api/init/initpb"
	"github.com/openconstellation/constellation/internal/attestation/softfirmware"
	"github.com/openconstellation/constellation/internal/bootstrapper/bootstraptest"
	"github.com/openconstellation/constellation/internal/bootstrapper/initserver"
	"github.com/openconstellation/constellation/internal/clusterrecord"
	"github.com/openconstellation/constellation/internal/deploy"
	"github.com/openconstellation/constellation/internal/kms"
	"github.com/openconstellation/constellation/internal/pki"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/snp"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// After kubeadm init and the records, the init server deploys the services with the admin
// kubeconfig (here the real deploy.Run against the test API server) and streams its progress.
func TestInitDeploysServices(t *testing.T) {
	var got initserver.Deployment
	e := newEnvWithDeploy(t, func(ctx context.Context, d initserver.Deployment) error {
		got = d
		return deploy.Run(ctx, d.Kubeconfig, deploy.Config{
			Image:       "localhost/constellation/services:0123456789ab",
			Attestation: d.Attestation,
			Platform: deploy.PlatformFacts{
				Name: "local", MetadataURL: "http://10.42.0.1:8080", TPM: "/run/constellation/tpm.sock", TPMKind: deploy.TPMSocket,
			},
		}, d.Progress)
	})
	t.Cleanup(forgetDeployment)
	req, master := request(t)
	want := withAttestation(t, e, req)
	res := e.call(req)
	require.NoError(t, res.Err)
	require.NotNil(t, res.Success)

	assert.Equal(t, res.Success.Kubeconfig, got.Kubeconfig)
	ms, err := master.MeasurementSecret()
	require.NoError(t, err)
	id, err := kms.ClusterID(ms, req.MeasurementSalt)
	require.NoError(t, err)
	assert.Equal(t, id, got.Cluster.ID())
	assert.Equal(t, "demo", got.Cluster.Name)
	assert.Equal(t, want, got.Attestation, "the join service admits nodes by what the CLI sent")
	assert.Equal(t, "10.42.0.254:6443", got.APIEndpoint, "the join service's tickets name the platform's API endpoint")

	joined := strings.Join(res.Progress, "\n")
	for _, want := range []string{
		"deploying the join, key and verification services",
		"deploy: created Secret kube-system/constellation-keyservice-tls",
		"deploy: applied DaemonSet kube-system/constellation-join-service",
		"in-cluster services deployed",
	} {
		assert.Contains(t, joined, want)
	}
	assert.Less(t, strings.Index(joined, "cluster recorded"), strings.Index(joined, "deploying the join"))
	for _, name := range deploy.DaemonSets {
		_, err := kube.Admin.AppsV1().DaemonSets(clusterrecord.Namespace).Get(context.Background(), name, metav1.GetOptions{})
		assert.NoError(t, err, name)
	}
}

// A failed deployment fails the init (after the lock: the log is streamed).
func TestInitDeployFails(t *testing.T) {
	e := newEnvWithDeploy(t, func(_ context.Context, d initserver.Deployment) error {
		d.Progress("applied ServiceAccount kube-system/constellation-key-service")
		return errors.New("deploy: applying DaemonSet kube-system/constellation-join-service: forbidden")
	})
	req, _ := request(t)
	withAttestation(t, e, req)
	res := e.call(req)
	assert.Equal(t, codes.Internal, status.Code(res.Err))
	assert.ErrorContains(t, res.Err, "deploying the in-cluster services: deploy: applying DaemonSet kube-system/constellation-join-service: forbidden")
	assert.Nil(t, res.Success)
	assert.Contains(t, string(res.Log), "deploy: applied ServiceAccount kube-system/constellation-key-service")
}

// A node that deploys the services refuses an init request without the attestation
// configuration, before it takes its lock.
func TestInitDeployNeedsAttestation(t *testing.T) {
	deployed := false
	e := newEnvWithDeploy(t, func(context.Context, initserver.Deployment) error { deployed = true; return nil })
	req, _ := request(t)
	res := e.call(req)
	assert.Equal(t, codes.InvalidArgument, status.Code(res.Err))
	assert.ErrorContains(t, res.Err, "needs the attestation configuration it admits nodes by")
	assert.False(t, deployed)
	assert.Empty(t, e.node.Node.LockHolder())
}

// withAttestation adds the attestation reference of the test image (AK roots: the test
// provider's CA) to req and returns it as the node should parse it.
func withAttestation(t *testing.T, e *env, req *initpb.InitRequest) choose.Reference {
	ref := choose.Reference{Variant: variant.QEMUVTPM, Values: choose.Values{
		Measurements: measurements.ReferenceSets{{Name: "image", Measurements: softfirmware.ExpectedPCRs(bootstraptest.Image)}},
		AKRoots:      string(pki.EncodeCert(e.ca.Certificate())),
	}}
	setReference(t, req, ref)
	parsed, err := choose.DecodeReference(req.AttestationReference)
	require.NoError(t, err)
	return parsed
}

// setReference puts ref into req as the CLI encodes it, unchecked: the node must check it.
func setReference(t *testing.T, req *initpb.InitRequest, ref choose.Reference) {
	data, err := ref.Encode()
	require.NoError(t, err)
	req.AttestationReference = data
}

// snpHardware is a valid hardware reference of the SEV-SNP variants (built as
// pkg/attestation/choose's tests do).
func snpHardware() *snp.Reference {
	ref := snp.DefaultReference("milan-2025")
	ref.Products = []string{"Milan"}
	ref.MinimumTCB = map[string]snp.TCB{"Milan": {Bootloader: 3, TEE: 0, SNP: 8, Microcode: 115}}
	ref.Measurements = snp.Digests{bytes.Repeat([]byte{1}, 48)}
	return &ref
}

// forgetDeployment removes what a deployment created in the shared API server.
func forgetDeployment() {
	ctx := context.Background()
	c := kube.Admin
	ns := clusterrecord.Namespace
	for _, name := range deploy.DaemonSets {
		_ = c.AppsV1().DaemonSets(ns).Delete(ctx, name, metav1.DeleteOptions{})
		_ = c.CoreV1().ServiceAccounts(ns).Delete(ctx, name, metav1.DeleteOptions{})
	}
	_ = c.RbacV1().Roles(ns).Delete(ctx, deploy.JoinService, metav1.DeleteOptions{})
	_ = c.RbacV1().RoleBindings(ns).Delete(ctx, deploy.JoinService, metav1.DeleteOptions{})
	_ = c.CoreV1().ConfigMaps(ns).Delete(ctx, clusterrecord.AttestationConfigMapName, metav1.DeleteOptions{})
	_ = c.CoreV1().Secrets(ns).Delete(ctx, clusterrecord.KeyServiceTLSSecretName, metav1.DeleteOptions{})
}
