package deploy_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/openconstellation/constellation/internal/cmdutil"
	"github.com/openconstellation/constellation/internal/deploy"
	"github.com/openconstellation/constellation/internal/diskowner"
	"github.com/openconstellation/constellation/internal/kube/kubeadm"
	"github.com/openconstellation/constellation/internal/kube/kubeadmconfig"
	"github.com/openconstellation/constellation/internal/kube/kubeletcsr"
	"github.com/openconstellation/constellation/internal/kube/kubetest"
	"github.com/openconstellation/constellation/internal/pki"
)

// TestNodeIdentityAttacks attacks node identity from a compromised, admitted worker (root on
// worker-0: the client certificate its join ticket carried) and from anyone holding a
// bootstrap token, against a control plane configured as Constellation configures it: a real
// kube-apiserver with kubeadm's authorization and admission settings, the objects deploy
// applies at init, and the real kube-controller-manager run with exactly the command line
// kubeadm gives it for Constellation's kubeadm configuration (all controllers, the CSR
// approver and signer among them). Credentials come from kubeletcred.Issue, the code the init
// server and (through kubeletcsr.IssueClient) the join service run.
//
// On the old wiring (kubeadm's bootstrap-token phase, a bootstrap token in every join
// ticket, a year-long client certificate) the token's CSR for control-plane-0 was approved and
// signed, and a removed worker's certificate kept working for a year.
func TestNodeIdentityAttacks(t *testing.T) {
	if testing.Short() {
		t.Skip("runs kube-apiserver, etcd, kubeadm and kube-controller-manager")
	}
	kube := kubetest.Start(t, kubetest.Options{})
	ctx := context.Background()
	admin := kube.Admin
	recordInit(t, admin)
	require.NoError(t, deploy.Apply(ctx, admin, config(t), nil))
	startControllerManagerAsKubeadm(t, kube)

	worker0 := nodeClient(t, kube, "worker-0")
	worker1 := nodeClient(t, kube, "worker-1")
	for name, c := range map[string]kubernetes.Interface{"worker-0": worker0, "worker-1": worker1} {
		_, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		require.NoError(t, err, "%s registers its Node", name)
	}

	// Attacks first, the positive controls after them: once kube-controller-manager has
	// approved and signed the controls, it has seen the attacks too.
	var attacks []string
	t.Run("via a bootstrap token", func(t *testing.T) {
		// An administrator creates a token the kubeadm way, for its default node group.
		token := kubeadmTokenCreate(t, kube)
		tokenClient := clientFor(t, kube, rest.Config{BearerToken: token})
		require.Eventually(t, func() bool {
			_, err := tokenClient.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authv1.SelfSubjectReview{}, metav1.CreateOptions{})
			return err == nil
		}, 30*time.Second, 100*time.Millisecond, "the token never authenticated")
		_, err := kubetest.PostCSR(ctx, tokenClient, "system:node:control-plane-0", []string{"system:nodes"}, certificatesv1.KubeAPIServerClientKubeletSignerName)
		require.True(t, apierrors.IsForbidden(err), "a bootstrap token may not even ask: %v", err)

		// Even where an administrator lets tokens ask (kubeadm's kubeadm:kubelet-bootstrap
		// rule, bound by hand), nothing approves what they ask for.
		_, err = admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "kubeadm:kubelet-bootstrap"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:node-bootstrapper"},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "Group", Name: "system:bootstrappers:kubeadm:default-node-token"}},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			name, err := kubetest.PostCSR(ctx, tokenClient, "system:node:control-plane-0", []string{"system:nodes"}, certificatesv1.KubeAPIServerClientKubeletSignerName)
			if err == nil {
				attacks = append(attacks, name)
			}
			return err == nil
		}, 30*time.Second, 100*time.Millisecond, "the hand-bound rule never took effect")
	})
	t.Run("via the node's own credentials", func(t *testing.T) {
		for _, tc := range []struct {
			cn     string
			orgs   []string
			signer string
		}{
			{"system:node:control-plane-0", []string{"system:nodes"}, certificatesv1.KubeAPIServerClientKubeletSignerName},
			{"system:node:worker-1", []string{"system:nodes"}, certificatesv1.KubeAPIServerClientKubeletSignerName},
			{"system:node:worker-0", []string{"system:nodes", "system:masters"}, certificatesv1.KubeAPIServerClientKubeletSignerName},
			{"kubernetes-admin", []string{"system:masters"}, certificatesv1.KubeAPIServerClientSignerName},
			{"system:node:control-plane-0", []string{"system:nodes"}, certificatesv1.KubeAPIServerClientSignerName},
		} {
			name, err := kubetest.PostCSR(ctx, worker0, tc.cn, tc.orgs, tc.signer)
			if err != nil {
				// Refused outright (the API server's own checks): fine, and nothing to approve.
				t.Logf("%s %v for %s refused at creation: %v", tc.cn, tc.orgs, tc.signer, err)
				continue
			}
			attacks = append(attacks, name)
		}
		require.NotEmpty(t, attacks)
	})

	t.Run("renewing its own certificate works", func(t *testing.T) {
		for _, c := range []struct {
			name   string
			client kubernetes.Interface
		}{{"worker-0", worker0}, {"worker-1", worker1}} {
			csr, err := kubetest.PostCSR(ctx, c.client, "system:node:"+c.name, []string{"system:nodes"}, certificatesv1.KubeAPIServerClientKubeletSignerName)
			require.NoError(t, err)
			cert := waitIssued(t, admin, csr)
			assert.Equal(t, "system:node:"+c.name, cert.Subject.CommonName)
			assert.LessOrEqual(t, time.Until(cert.NotAfter), kubeletcsr.ClientValidity, "kube-controller-manager signs renewals for as long as Constellation's own")
		}
	})

	t.Run("none of the attacks is ever approved", func(t *testing.T) {
		for _, name := range attacks {
			csr, err := admin.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
			require.NoError(t, err)
			for _, cond := range csr.Status.Conditions {
				assert.NotEqual(t, certificatesv1.CertificateApproved, cond.Type, "%s (%s for %s) was approved", name, csrSubject(t, csr), csr.Spec.Username)
			}
			assert.Empty(t, csr.Status.Certificate, "%s was signed", name)
		}
	})

	t.Run("removal revokes", func(t *testing.T) {
		removedAt := time.Now()
		require.NoError(t, (diskowner.Store{Client: admin}).MarkRemoved(ctx, "worker-0", removedAt))
		// The policy's parameters reach the API server through an informer: poll what the
		// removed node would do next, renew its certificate.
		var err error
		require.Eventually(t, func() bool {
			_, err = kubetest.PostCSR(ctx, worker0, "system:node:worker-0", []string{"system:nodes"}, certificatesv1.KubeAPIServerClientKubeletSignerName)
			return apierrors.IsForbidden(err)
		}, 30*time.Second, 50*time.Millisecond, "the removed node can still renew: %v", err)
		t.Logf("revoked %s after the removal record was written", time.Since(removedAt).Round(time.Millisecond))
		assert.ErrorContains(t, err, "node worker-0 was removed from the cluster")

		refused := map[string]func() error{
			"update its Node": func() error {
				n, err := admin.CoreV1().Nodes().Get(ctx, "worker-0", metav1.GetOptions{})
				require.NoError(t, err)
				n.Labels = map[string]string{"x": "y"}
				_, err = worker0.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
				return err
			},
			"renew its lease": func() error {
				_, err := worker0.CoordinationV1().Leases(corev1.NamespaceNodeLease).Create(ctx, &coordinationv1.Lease{
					ObjectMeta: metav1.ObjectMeta{Name: "worker-0"},
					Spec:       coordinationv1.LeaseSpec{HolderIdentity: strPtr("worker-0")},
				}, metav1.CreateOptions{})
				return err
			},
			"post an event": func() error {
				_, err := worker0.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, &corev1.Event{
					ObjectMeta:     metav1.ObjectMeta{GenerateName: "worker-0-"},
					InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: "worker-0"},
				}, metav1.CreateOptions{})
				return err
			},
		}
		for action, call := range refused {
			err := call()
			assert.True(t, apierrors.IsForbidden(err), "%s: want Forbidden, got %v", action, err)
			assert.ErrorContains(t, err, "was removed from the cluster", action)
		}

		// apply deletes the Node; neither the node nor anyone else may create it again.
		require.NoError(t, admin.CoreV1().Nodes().Delete(ctx, "worker-0", metav1.DeleteOptions{}))
		_, err = worker0.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "worker-0"}}, metav1.CreateOptions{})
		assert.True(t, apierrors.IsForbidden(err), "the removed node re-created its Node: %v", err)
		_, err = admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "worker-0"}}, metav1.CreateOptions{})
		assert.True(t, apierrors.IsForbidden(err), "a Node of the removed name was created: %v", err)
		assert.ErrorContains(t, err, "its name is not given out again")

		// Nor is a pod bound to it: not created so, not bound by a Binding (as a scheduler or
		// a DaemonSet controller acting on a stale view of the Nodes would), so the Node
		// authorizer never links anything to the removed node again. A pod bound to a node
		// that stays is created and bound as before.
		boundPod := func(name, node string) *corev1.Pod {
			return &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10.1"}},
					Volumes: []corev1.Volume{{Name: "s", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "db"}}}}},
			}
		}
		require.Eventually(t, func() bool {
			// The namespace's default service account, which the pods need, is the
			// serviceaccount controller's to create.
			_, err := admin.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Get(ctx, "default", metav1.GetOptions{})
			return err == nil
		}, 30*time.Second, 50*time.Millisecond)
		_, err = admin.CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, boundPod("to-removed", "worker-0"), metav1.CreateOptions{})
		assert.True(t, apierrors.IsForbidden(err), "a pod was created bound to the removed node: %v", err)
		assert.ErrorContains(t, err, "no pod is bound to it again")
		_, err = admin.CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, boundPod("unbound", ""), metav1.CreateOptions{})
		require.NoError(t, err)
		err = admin.CoreV1().Pods(metav1.NamespaceDefault).Bind(ctx, &corev1.Binding{
			ObjectMeta: metav1.ObjectMeta{Name: "unbound"}, Target: corev1.ObjectReference{Kind: "Node", Name: "worker-0"},
		}, metav1.CreateOptions{})
		assert.True(t, apierrors.IsForbidden(err), "a pod was bound to the removed node: %v", err)
		_, err = admin.CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, boundPod("to-worker-1", "worker-1"), metav1.CreateOptions{})
		assert.NoError(t, err, "a pod bound to another node")
		assert.NoError(t, admin.CoreV1().Pods(metav1.NamespaceDefault).Bind(ctx, &corev1.Binding{
			ObjectMeta: metav1.ObjectMeta{Name: "unbound"}, Target: corev1.ObjectReference{Kind: "Node", Name: "worker-1"},
		}, metav1.CreateOptions{}), "a binding to another node")

		// The policy is precise: another node, and a stray record without a name, change
		// nothing for worker-1.
		_, err = admin.CoreV1().ConfigMaps(diskowner.Namespace).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
			Name: "removed-nobody", Labels: map[string]string{diskowner.RecordKindLabel: diskowner.RemovedLabel},
		}}, metav1.CreateOptions{})
		require.NoError(t, err)
		n, err := worker1.CoreV1().Nodes().Get(ctx, "worker-1", metav1.GetOptions{})
		require.NoError(t, err)
		n.Labels = map[string]string{"still": "works"}
		_, err = worker1.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		require.NoError(t, err)
		csr, err := kubetest.PostCSR(ctx, worker1, "system:node:worker-1", []string{"system:nodes"}, certificatesv1.KubeAPIServerClientKubeletSignerName)
		require.NoError(t, err)
		waitIssued(t, admin, csr)
	})
}

// startControllerManagerAsKubeadm runs the real kube-controller-manager with the command line
// kubeadm writes into its static pod for Constellation's init configuration (from `kubeadm
// init --dry-run`), with the paths of kube's PKI and admin kubeconfig, and without its
// serving port (parallel tests).
func startControllerManagerAsKubeadm(t *testing.T, kube *kubetest.Cluster) {
	t.Helper()
	cfg, err := kubeadmconfig.Init(kubeadmconfig.InitParams{
		NodeName: "control-plane-0", NodeIP: netip.MustParseAddr("10.42.0.2"),
		KubernetesVersion: kubetest.Version, ServiceCIDR: netip.MustParsePrefix("10.96.0.0/12"),
		CRISocket: "unix:///run/containerd/containerd.sock", Sandbox: true, KubeletServingCert: true,
	})
	require.NoError(t, err)
	bin, err := kubetest.Binary("kubeadm")
	require.NoError(t, err)
	dir := t.TempDir()
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.NoError(t, kubeadm.Runner{Binary: bin, DryRun: true, Env: []string{"KUBEADM_INIT_DRYRUN_DIR=" + dir}}.Init(ctx, cfg, &out), "%s", out.String())
	manifest, err := os.ReadFile(filepath.Join(dir, "kube-controller-manager.yaml"))
	require.NoError(t, err)
	var pod corev1.Pod
	require.NoError(t, yaml.Unmarshal(manifest, &pod))
	command := pod.Spec.Containers[0].Command
	require.Equal(t, "kube-controller-manager", command[0])
	var args []string
	for _, arg := range command[1:] {
		arg = strings.ReplaceAll(arg, kubeadmconfig.CertificatesDir+"/", kube.PKIDir+"/")
		arg = strings.ReplaceAll(arg, "/etc/kubernetes/controller-manager.conf", kube.Kubeconfig)
		args = append(args, arg)
	}
	require.Contains(t, args, "--cluster-signing-duration="+kubeletcsr.ClientValidity.String())
	require.Contains(t, args, "--cluster-signing-key-file="+filepath.Join(kube.PKIDir, pki.CAKey))
	args = append(args, "--secure-port=0")

	kcm, err := kubetest.Binary("kube-controller-manager")
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(context.Background())
	cmd := exec.CommandContext(runCtx, kcm, args...)
	var logs cmdutil.SyncBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		stop()
		_ = cmd.Wait()
		if t.Failed() {
			out := logs.String()
			if len(out) > 8192 {
				out = out[len(out)-8192:]
			}
			t.Logf("kube-controller-manager %s:\n%s", strings.Join(args, " "), out)
		}
	})
}

// nodeClient authenticates as the node with a client certificate from the cluster CA, issued
// as Constellation issues every node's (kubeletcred.Issue).
func nodeClient(t *testing.T, kube *kubetest.Cluster, name string) kubernetes.Interface {
	t.Helper()
	c, err := kube.NodeClient(name)
	require.NoError(t, err)
	return c
}

func clientFor(t *testing.T, kube *kubetest.Cluster, auth rest.Config) kubernetes.Interface {
	t.Helper()
	c, err := kube.ClientFor(auth)
	require.NoError(t, err)
	return c
}

// waitIssued waits until kube-controller-manager approved and signed the CSR and returns the
// certificate.
func waitIssued(t *testing.T, admin kubernetes.Interface, name string) *x509.Certificate {
	t.Helper()
	var csr *certificatesv1.CertificateSigningRequest
	require.Eventually(t, func() bool {
		var err error
		csr, err = admin.CertificatesV1().CertificateSigningRequests().Get(context.Background(), name, metav1.GetOptions{})
		return err == nil && len(csr.Status.Certificate) > 0
	}, 60*time.Second, 100*time.Millisecond, "CSR %s was not approved and signed", name)
	cert, err := pki.ParseCert(csr.Status.Certificate)
	require.NoError(t, err)
	return cert
}

func csrSubject(t *testing.T, csr *certificatesv1.CertificateSigningRequest) string {
	block, _ := pem.Decode(csr.Spec.Request)
	require.NotNil(t, block)
	req, err := x509.ParseCertificateRequest(block.Bytes)
	require.NoError(t, err)
	return req.Subject.String()
}

// kubeadmTokenCreate creates a bootstrap token with the real `kubeadm token create`, as an
// administrator would.
func kubeadmTokenCreate(t *testing.T, kube *kubetest.Cluster) string {
	t.Helper()
	bin, err := kubetest.Binary("kubeadm")
	require.NoError(t, err)
	out, err := exec.Command(bin, "token", "create", "--kubeconfig", kube.Kubeconfig).CombinedOutput()
	require.NoError(t, err, "%s", out)
	token := regexp.MustCompile(`[a-z0-9]{6}\.[a-z0-9]{16}`).Find(out)
	require.NotNil(t, token, "no token in %q", out)
	return string(token)
}

func strPtr(s string) *string { return &s }
