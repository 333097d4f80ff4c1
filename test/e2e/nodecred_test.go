package e2e

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/openconstellation/constellation/internal/kube/kubeletcsr"
	"github.com/openconstellation/constellation/internal/kube/kubetest"
	"github.com/openconstellation/constellation/internal/pki"
)

// nodeCredential is a node's kubelet client certificate and key (PEM), as an attacker with
// root on the node holds them.
type nodeCredential struct{ cert, key []byte }

// kubeletCredential reads the kubelet's current client credential of node (the pair its
// kubelet authenticates with, renewed through kube-controller-manager) from inside the
// node's mount namespace, through its kubelet's /proc/<pid>/root.
func kubeletCredential(t *testing.T, ws, node string) nodeCredential {
	t.Helper()
	root := filepath.Join("/proc", strconv.Itoa(kubeletPID(t, bootstrapperPID(t, ws, node))), "root")
	// kubelet-client-current.pem links to an absolute path, which the kernel would resolve
	// against this process's root, not the node's: resolve it below the node's root.
	current := "/var/lib/kubelet/pki/kubelet-client-current.pem"
	target, err := os.Readlink(filepath.Join(root, current))
	require.NoError(t, err)
	if !filepath.IsAbs(target) {
		target = filepath.Join(filepath.Dir(current), target)
	}
	pair, err := os.ReadFile(filepath.Join(root, target))
	require.NoError(t, err)
	cert, err := pki.ParseCert(pair)
	require.NoError(t, err)
	assert.Equal(t, "system:node:"+node, cert.Subject.CommonName)
	assert.LessOrEqual(t, cert.NotAfter.Sub(cert.NotBefore), kubeletcsr.ClientValidity+10*time.Minute, "the kubelet's client certificate is short-lived")
	return nodeCredential{cert: pair, key: pair}
}

// kubeletPID finds the kubelet the bootstrapper with PID parent supervises.
func kubeletPID(t *testing.T, parent int) int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	require.NoError(t, err)
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so split after its ')'.
		rest := string(stat[bytes.LastIndexByte(stat, ')')+1:])
		fields := strings.Fields(rest)
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if len(fields) > 1 && fields[1] == strconv.Itoa(parent) && filepath.Base(strings.SplitN(string(cmdline), "\x00", 2)[0]) == "kubelet" {
			return pid
		}
	}
	t.Fatalf("no kubelet below bootstrapper %d", parent)
	return 0
}

// client authenticates with the credential against the cluster of the admin kubeconfig.
func (c nodeCredential) client(t *testing.T, adminKubeconfig string) kubernetes.Interface {
	t.Helper()
	admin, err := clientcmd.BuildConfigFromFlags("", adminKubeconfig)
	require.NoError(t, err)
	cfg := &rest.Config{
		Host:            admin.Host,
		TLSClientConfig: rest.TLSClientConfig{CAData: admin.CAData, CAFile: admin.CAFile, CertData: c.cert, KeyData: c.key},
		Timeout:         30 * time.Second,
	}
	client, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	return client
}

func adminClient(t testing.TB, kubeconfig string) kubernetes.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	require.NoError(t, err)
	cfg.Timeout = 30 * time.Second
	client, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	return client
}

func whoami(t *testing.T, c kubernetes.Interface) string {
	t.Helper()
	review, err := c.AuthenticationV1().SelfSubjectReviews().Create(t.Context(), &authv1.SelfSubjectReview{}, metav1.CreateOptions{})
	require.NoError(t, err)
	return review.Status.UserInfo.Username
}

// assertNoOtherIdentity has a node (asNode, authenticated as system:node:<self>) ask the
// cluster's real kube-controller-manager for other identities: another node's (victim, a
// control plane), the masters group, an admin. None is ever approved: each is refused when
// posted, or still unapproved and unsigned once the node's request for its own name, posted
// after them, has been approved and signed.
func assertNoOtherIdentity(t *testing.T, admin, asNode kubernetes.Interface, self, victim string) {
	t.Helper()
	ctx := t.Context()
	kubelet, client := certificatesv1.KubeAPIServerClientKubeletSignerName, certificatesv1.KubeAPIServerClientSignerName
	var posted []string
	t.Cleanup(func() {
		for _, name := range posted {
			_ = admin.CertificatesV1().CertificateSigningRequests().Delete(context.Background(), name, metav1.DeleteOptions{})
		}
	})
	var attacks []string
	for _, a := range []struct {
		cn     string
		orgs   []string
		signer string
	}{
		{"system:node:" + victim, []string{"system:nodes"}, kubelet},
		{"system:node:" + self, []string{"system:nodes", "system:masters"}, kubelet},
		{"system:node:" + victim, []string{"system:nodes"}, client},
		{"kubernetes-admin", []string{"system:masters"}, client},
	} {
		name, err := kubetest.PostCSR(ctx, asNode, a.cn, a.orgs, a.signer)
		if err != nil {
			t.Logf("%s %v from %s: refused when posted: %v", a.cn, a.orgs, a.signer, err)
			continue
		}
		posted = append(posted, name)
		attacks = append(attacks, name)
	}
	own, err := kubetest.PostCSR(ctx, asNode, "system:node:"+self, []string{"system:nodes"}, kubelet)
	require.NoError(t, err)
	posted = append(posted, own)
	var issued *certificatesv1.CertificateSigningRequest
	require.Eventually(t, func() bool {
		issued, err = admin.CertificatesV1().CertificateSigningRequests().Get(ctx, own, metav1.GetOptions{})
		return err == nil && len(issued.Status.Certificate) > 0
	}, 2*time.Minute, 200*time.Millisecond, "the node's request for its own name was not approved: the approver does not run")
	cert, err := pki.ParseCert(issued.Status.Certificate)
	require.NoError(t, err)
	assert.Equal(t, "system:node:"+self, cert.Subject.CommonName)
	assert.LessOrEqual(t, time.Until(cert.NotAfter), kubeletcsr.ClientValidity, "renewals are as short-lived as Constellation's certificates")
	for _, name := range attacks {
		csr, err := admin.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
		require.NoError(t, err)
		for _, c := range csr.Status.Conditions {
			assert.NotEqual(t, certificatesv1.CertificateApproved, c.Type, "CSR %s by %s was approved", name, csr.Spec.Username)
		}
		assert.Empty(t, csr.Status.Certificate, "CSR %s by %s was signed", name, csr.Spec.Username)
	}
}

// assertRevoked checks that a removed node's credential can do nothing: no write (not renew
// itself, not re-create its Node, not renew its lease; the admission policy refuses them as
// soon as the removal is recorded) and no read (who it is, Services, its Node; the
// removed-node authorizer refuses them within its cache time, nodeauthz.CacheTTL).
func assertRevoked(t *testing.T, asNode kubernetes.Interface, node string) {
	t.Helper()
	ctx := t.Context()
	var readErrs map[string]error
	start := time.Now()
	refused := assert.Eventually(t, func() bool {
		_, whoami := asNode.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authv1.SelfSubjectReview{}, metav1.CreateOptions{})
		_, services := asNode.CoreV1().Services("").List(ctx, metav1.ListOptions{})
		_, own := asNode.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		readErrs = map[string]error{"who am I": whoami, "list Services": services, "get its Node": own}
		for _, err := range readErrs {
			if !apierrors.IsForbidden(err) {
				return false
			}
		}
		return true
	}, 5*time.Second, 100*time.Millisecond, "the removed node's reads are not all refused within 5 s")
	if !refused {
		t.Fatalf("the removed node's reads, last answers: %v", readErrs)
	}
	t.Logf("reads refused %s after apply returned", time.Since(start).Round(time.Millisecond))
	for what, err := range readErrs {
		assert.ErrorContains(t, err, "node "+node+" was removed from the cluster", what)
	}
	for action, call := range map[string]func() error{
		"renew its certificate": func() error {
			_, err := kubetest.PostCSR(ctx, asNode, "system:node:"+node, []string{"system:nodes"}, certificatesv1.KubeAPIServerClientKubeletSignerName)
			return err
		},
		"re-create its Node": func() error {
			_, err := asNode.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{})
			return err
		},
		"renew its lease": func() error {
			_, err := asNode.CoordinationV1().Leases(corev1.NamespaceNodeLease).Create(ctx, &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: node}, Spec: coordinationv1.LeaseSpec{HolderIdentity: &node},
			}, metav1.CreateOptions{})
			return err
		},
	} {
		err := call()
		assert.True(t, apierrors.IsForbidden(err), "%s: want Forbidden, got %v", action, err)
		assert.ErrorContains(t, err, "node "+node+" was removed from the cluster", action)
	}
}
