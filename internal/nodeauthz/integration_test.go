package nodeauthz_test

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/openconstellation/constellation/internal/diskowner"
	"github.com/openconstellation/constellation/internal/kube/kubetest"
	"github.com/openconstellation/constellation/internal/nodeauthz"
	"github.com/openconstellation/constellation/internal/pki"
)

// StartWithAuthorizer starts a control plane whose API server asks the removed-node
// authorizer, configured with the files WriteAPIServerFiles writes (as a control plane's
// init server and join client write them), and the authorizer itself, served by Start (as
// a control plane's bootstrapper serves it, reporting its readiness as node's), on a free
// loopback port.
func startWithAuthorizer(t *testing.T, node string) (*kubetest.Cluster, *nodeauthz.Server) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	filesDir := t.TempDir()
	kube := kubetest.Start(t, kubetest.Options{AuthorizationConfig: func(pkiDir string) (string, error) {
		if err := nodeauthz.WriteAPIServerFiles(filesDir, filepath.Join(pkiDir, pki.CACert), addr); err != nil {
			return "", err
		}
		return filepath.Join(filesDir, filepath.Base(nodeauthz.AuthorizationConfigFile)), nil
	}})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	srv, err := nodeauthz.Start(ctx, nodeauthz.Config{PKIDir: kube.PKIDir, Kubeconfig: kube.Kubeconfig, Addr: addr, Node: node})
	require.NoError(t, err)
	require.Eventually(t, srv.Removed.Synced, 30*time.Second, 50*time.Millisecond, "the removal records were never listed")
	return kube, srv
}

func nodeClient(t *testing.T, kube *kubetest.Cluster, name string) kubernetes.Interface {
	t.Helper()
	c, err := kube.NodeClient(name)
	require.NoError(t, err)
	return c
}

// reads are what a node may read of the cluster with no pod bound to it: who it is, the
// cluster's Services, its own Node, the API's version.
func reads(ctx context.Context, c kubernetes.Interface, node string) map[string]error {
	_, whoami := c.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authv1.SelfSubjectReview{}, metav1.CreateOptions{})
	_, services := c.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	_, own := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	_, version := c.Discovery().ServerVersion()
	return map[string]error{"who am I": whoami, "list Services": services, "get its Node": own, "version": version}
}

// TestRemovedNodeReadsNothing: a node removed from the cluster (its removal record written)
// keeps its client certificate; with it, it can no longer read anything, while other nodes
// and administrators are unaffected. If the authorizer is down, the API server has no
// opinion from it: the node authorizer decides again (the second layer is the admission
// policy, internal/deploy).
func TestRemovedNodeReadsNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("runs kube-apiserver and etcd")
	}
	kube, srv := startWithAuthorizer(t, "")
	ctx := context.Background()
	worker0, worker1 := nodeClient(t, kube, "worker-0"), nodeClient(t, kube, "worker-1")
	for name, c := range map[string]kubernetes.Interface{"worker-0": worker0, "worker-1": worker1} {
		_, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		require.NoError(t, err)
		for what, err := range reads(ctx, c, name) {
			require.NoError(t, err, "%s before any removal: %s", name, what)
		}
	}

	require.NoError(t, diskowner.EnsureNamespace(ctx, kube.Admin))
	removedAt := time.Now()
	require.NoError(t, diskowner.Store{Client: kube.Admin}.MarkRemoved(ctx, "worker-0", removedAt))
	require.Eventually(t, func() bool { return srv.Removed.Removed("worker-0") }, 30*time.Second, 10*time.Millisecond)
	// The API server caches decisions for nodeauthz.CacheTTL.
	var errs map[string]error
	require.Eventually(t, func() bool {
		errs = reads(ctx, worker0, "worker-0")
		for _, err := range errs {
			if !apierrors.IsForbidden(err) {
				return false
			}
		}
		return true
	}, 10*time.Second, 50*time.Millisecond, "the removed node still reads: %v", errs)
	t.Logf("every read refused %s after the removal record was written", time.Since(removedAt).Round(time.Millisecond))
	for what, err := range errs {
		if what != "version" { // discovery drops the status message
			assert.ErrorContains(t, err, "node worker-0 was removed from the cluster", what)
		}
	}
	_, err := worker0.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "worker-0-x"}}, metav1.CreateOptions{})
	assert.True(t, apierrors.IsForbidden(err), "writes are refused too: %v", err)

	for what, err := range reads(ctx, worker1, "worker-1") {
		assert.NoError(t, err, "another node: %s", what)
	}
	_, err = kube.Admin.CoreV1().Nodes().Get(ctx, "worker-0", metav1.GetOptions{})
	assert.NoError(t, err, "administrators are not nodes")

	// Down: no opinion, the Node authorizer decides again (a refused connection costs
	// nothing).
	require.NoError(t, srv.Close())
	require.Eventually(t, func() bool {
		_, err := worker0.CoreV1().Services("").List(ctx, metav1.ListOptions{})
		return err == nil
	}, 10*time.Second, 50*time.Millisecond, "without the authorizer the Node authorizer decides again")
	for what, err := range reads(ctx, worker1, "worker-1") {
		assert.NoError(t, err, "other nodes while the authorizer is down: %s", what)
	}
}

// TestReadinessReport: a control plane's authorizer reports its readiness into the cluster,
// where the CLI reads it (nodeauthz.Reports, as status and apply do): ready once synced, and
// not ready within seconds once it stops serving (its report names why), so a control plane
// whose authorizer is down shows as degraded instead of failing open unnoticed.
func TestReadinessReport(t *testing.T) {
	if testing.Short() {
		t.Skip("runs kube-apiserver and etcd")
	}
	kube, srv := startWithAuthorizer(t, "control-plane-0")
	ctx := t.Context()
	health := func() nodeauthz.Health {
		reports, err := nodeauthz.Reports(ctx, kube.Admin)
		require.NoError(t, err)
		return nodeauthz.Assess(reports, "control-plane-0", time.Now())
	}
	var h nodeauthz.Health
	require.Eventually(t, func() bool { h = health(); return h.Ready }, 10*time.Second, 50*time.Millisecond, "never reported ready: %+v", h)
	assert.Equal(t, "synced", h.Why)
	assert.False(t, nodeauthz.Assess(map[string]nodeauthz.Report{}, "control-plane-1", time.Now()).Reported, "another control plane reported nothing")

	stopped := time.Now()
	require.NoError(t, srv.Close())
	require.Eventually(t, func() bool { h = health(); return !h.Ready }, 10*time.Second, 50*time.Millisecond, "still reported ready: %+v", h)
	t.Logf("reported not ready %s after it stopped serving: %s", time.Since(stopped).Round(time.Millisecond), h.Why)
	assert.True(t, h.Reported)
	assert.Contains(t, h.Why, "not serving")
}
