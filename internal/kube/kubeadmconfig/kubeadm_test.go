package kubeadmconfig_test

// Tests against the real kubeadm v1.34.4 (built by hack/build-kube.sh; kubetest finds it).

import (
	"bytes"
	"context"
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
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	kubeadmv1beta4 "k8s.io/kubernetes/cmd/kubeadm/app/apis/kubeadm/v1beta4"
	"k8s.io/utils/ptr"

	"github.com/openconstellation/constellation/internal/kube/bootstraptoken"
	"github.com/openconstellation/constellation/internal/kube/kubeadmconfig"
	"github.com/openconstellation/constellation/internal/kube/kubetest"
	"github.com/openconstellation/constellation/internal/pki"
)

// runKubeadm runs the real kubeadm with args, and env added to the environment, and returns
// its stdout and stderr.
func runKubeadm(t *testing.T, env []string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	bin, err := kubetest.Binary("kubeadm")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

// validate runs `kubeadm config validate` on data.
func validate(t *testing.T, data []byte) (stdout, stderr string, err error) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "kubeadm.yaml")
	require.NoError(t, os.WriteFile(file, data, 0o600))
	return runKubeadm(t, nil, "config", "validate", "--config", file)
}

func TestKubeadmAcceptsConfigs(t *testing.T) {
	plainJoin := sandboxJoin(false)
	plainJoin.Sandbox = false
	ipv6 := plainInit()
	ipv6.NodeIP = netip.MustParseAddr("fd00:88::2")
	ipv6.ServiceCIDR = netip.MustParsePrefix("fd00:96::/112")
	ipv6.PodCIDR = netip.MustParsePrefix("fd00:244::/56")

	testCases := map[string]func() ([]byte, error){
		"init sandbox":       func() ([]byte, error) { return kubeadmconfig.Init(sandboxInit()) },
		"init plain":         func() ([]byte, error) { return kubeadmconfig.Init(plainInit()) },
		"init IPv6":          func() ([]byte, error) { return kubeadmconfig.Init(ipv6) },
		"join sandbox":       func() ([]byte, error) { return kubeadmconfig.Join(sandboxJoin(false)) },
		"join control plane": func() ([]byte, error) { return kubeadmconfig.Join(sandboxJoin(true)) },
		"join plain":         func() ([]byte, error) { return kubeadmconfig.Join(plainJoin) },
	}
	for name, generate := range testCases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			data, err := generate()
			require.NoError(t, err)
			stdout, stderr, err := validate(t, data)
			require.NoError(t, err, "kubeadm config validate:\n%s%s\nconfig:\n%s", stdout, stderr, data)
			assert.Equal(t, "ok\n", stdout)
			assert.NotContains(t, stderr, "WARNING", "kubeadm warns about the config:\n%s", stderr)
		})
	}
}

// TestKubeadmRejectsCorruptConfigs proves that the check above can fail.
func TestKubeadmRejectsCorruptConfigs(t *testing.T) {
	initCfg, err := kubeadmconfig.Init(sandboxInit())
	require.NoError(t, err)
	joinCfg, err := kubeadmconfig.Join(sandboxJoin(true))
	require.NoError(t, err)

	testCases := map[string]struct {
		data []byte
		want string
	}{
		"invalid advertise address": {
			data: replace(t, initCfg, "advertiseAddress: 10.88.0.2", "advertiseAddress: 10.88.0.256"),
			want: `couldn't use "10.88.0.256"`,
		},
		"unknown kubelet field": {
			data: replace(t, initCfg, "rotateCertificates: true", "rotateCertificates: true\nrotateCertificatez: true"),
			want: `strict decoding error: unknown field "rotateCertificatez"`,
		},
		"unknown kind": {
			data: replace(t, initCfg, "kind: ClusterConfiguration", "kind: ClusterConfig"),
			want: `unknown configuration APIs: []schema.GroupVersionKind{schema.GroupVersionKind{Group:"kubeadm.k8s.io", Version:"v1beta4", Kind:"ClusterConfig"}}`,
		},
		// kubeadm checks the hashes' format only when it discovers the cluster (Join does it
		// up front), but it insists on at least one.
		"no CA hash": {
			data: replace(t, joinCfg, "    caCertHashes:\n    - "+caHash+"\n", ""),
			want: "discovery.bootstrapToken.caCertHashes",
		},
		"invalid token": {
			data: replace(t, joinCfg, "token: "+token, "token: abc"),
			want: "discovery.bootstrapToken.token",
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			stdout, stderr, err := validate(t, tc.data)
			require.Error(t, err, "kubeadm accepted:\n%s", tc.data)
			assert.NotContains(t, stdout, "ok")
			assert.Contains(t, stderr, tc.want)
		})
	}
}

func replace(t *testing.T, data []byte, old, new string) []byte {
	t.Helper()
	require.Contains(t, string(data), old)
	return bytes.Replace(data, []byte(old), []byte(new), 1)
}

// TestKubeadmJoinIgnoresKubeletConfiguration documents why Join returns no
// KubeletConfiguration: kubeadm join does not read it, not even to validate it.
func TestKubeadmJoinIgnoresKubeletConfiguration(t *testing.T) {
	joinCfg, err := kubeadmconfig.Join(sandboxJoin(false))
	require.NoError(t, err)
	brokenKubelet := "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nnoSuchField: true\ncgroupDriver: 42\n"
	stdout, stderr, err := validate(t, append(joinCfg, []byte("---\n"+brokenKubelet)...))
	require.NoError(t, err, "%s%s", stdout, stderr)
	assert.Contains(t, stderr, "Ignored configuration document with GroupVersionKind kubelet.config.k8s.io/v1beta1, Kind=KubeletConfiguration")

	// The same document in an init configuration is read, and rejected.
	initCfg, err := kubeadmconfig.Init(sandboxInit())
	require.NoError(t, err)
	initCfg = bytes.Replace(initCfg, []byte("rotateCertificates: true"), []byte("rotateCertificates: true\nnoSuchField: true"), 1)
	_, stderr, err = validate(t, initCfg)
	require.Error(t, err)
	assert.Contains(t, stderr, "noSuchField")
}

// TestKubeadmInitThenJoin runs, against a real control plane (etcd, kube-apiserver and the
// kube-controller-manager's bootstrap-signer and token-cleaner controllers), the phases of
// `kubeadm init` that only talk to the API server, with Init's configuration, and then
// `kubeadm join --dry-run` with Join's: the bootstrap token kubeadm init insists on dies within
// seconds, the uploaded configuration carries our settings, and a joining node discovers the
// cluster with the token and the CA pin and gets Init's kubelet configuration.
//
// Limits: dry-run join skips the TLS bootstrap and, in discovery, the second cluster-info
// request over the pinned CA (the pin is still checked against the CA in cluster-info);
// a control-plane join cannot be dry-run without the cluster CA keys in /etc/kubernetes/pki.
// The dry run writes only into KUBEADM_JOIN_DRYRUN_DIR; its preflight checks only read the
// host (their failures are ignored: Sandbox).
func TestKubeadmInitThenJoin(t *testing.T) {
	kube := kubetest.Start(t, kubetest.Options{})
	startControllerManager(t, kube, "bootstrapsigner", "tokencleaner")
	ctx := context.Background()
	dir := t.TempDir()
	initCfg, err := kubeadmconfig.Init(sandboxInit())
	require.NoError(t, err)
	initFile := filepath.Join(dir, "init.yaml")
	require.NoError(t, os.WriteFile(initFile, initCfg, 0o600))

	// 1. kubeadm init's bootstrap-token phase: one token, dead within InitTokenTTL, plus the
	// RBAC rules and cluster-info that join tokens need.
	before := time.Now()
	stdout, stderr, err := runKubeadm(t, nil, "init", "phase", "bootstrap-token", "--config", initFile, "--kubeconfig", kube.Kubeconfig)
	require.NoError(t, err, "%s%s", stdout, stderr)
	after := time.Now()
	m := regexp.MustCompile(`Using token: ([a-z0-9]{6})\.([a-z0-9]{16})`).FindStringSubmatch(stdout)
	require.NotNil(t, m, "no token in kubeadm's output:\n%s", stdout)
	initToken := m[1] + "." + m[2]

	secret, err := kube.Admin.CoreV1().Secrets("kube-system").Get(ctx, "bootstrap-token-"+m[1], metav1.GetOptions{})
	require.NoError(t, err)
	expiration, err := time.Parse(time.RFC3339, string(secret.Data["expiration"]))
	require.NoError(t, err)
	assert.WithinRange(t, expiration, before.Truncate(time.Second), after.Add(kubeadmconfig.InitTokenTTL))
	assert.Contains(t, string(secret.Data["description"]), "unused")
	require.Eventually(t, func() bool {
		_, err := kube.Admin.CoreV1().Secrets("kube-system").Get(ctx, secret.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}, 30*time.Second, 100*time.Millisecond, "the token cleaner did not delete kubeadm init's expired token")
	client, err := kube.ClientFor(rest.Config{BearerToken: initToken})
	require.NoError(t, err)
	_, err = client.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authv1.SelfSubjectReview{}, metav1.CreateOptions{})
	require.True(t, apierrors.IsUnauthorized(err), "kubeadm init's token: %v", err)

	for _, name := range []string{"kubeadm:kubelet-bootstrap", "kubeadm:node-autoapprove-bootstrap", "kubeadm:node-autoapprove-certificate-rotation"} {
		_, err := kube.Admin.RbacV1().ClusterRoleBindings().Get(ctx, name, metav1.GetOptions{})
		assert.NoError(t, err, "bootstrap RBAC %s", name)
	}

	// 2. kubeadm init's upload-config phase: the cluster-wide configuration joining nodes get.
	stdout, stderr, err = runKubeadm(t, nil, "init", "phase", "upload-config", "all", "--config", initFile, "--kubeconfig", kube.Kubeconfig)
	require.NoError(t, err, "%s%s", stdout, stderr)
	kubeadmCM, err := kube.Admin.CoreV1().ConfigMaps("kube-system").Get(ctx, "kubeadm-config", metav1.GetOptions{})
	require.NoError(t, err)
	cluster := decodeOne[*kubeadmv1beta4.ClusterConfiguration](t, []byte(kubeadmCM.Data["ClusterConfiguration"]))
	assert.Equal(t, "10.88.0.2:6443", cluster.ControlPlaneEndpoint)
	assert.Equal(t, kubeadmv1beta4.EncryptionAlgorithmECDSAP256, cluster.EncryptionAlgorithm)
	assert.Contains(t, cluster.APIServer.ExtraArgs, kubeadmv1beta4.Arg{Name: "kubelet-certificate-authority", Value: "/etc/kubernetes/pki/ca.crt"})
	assert.Equal(t, "10.244.0.0/16", cluster.Networking.PodSubnet)

	// 3. kubeadm join --dry-run with a join token as Constellation's join service makes one.
	joinToken, err := bootstraptoken.Create(ctx, kube.Admin, time.Hour, time.Now(), "join")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		cm, err := kube.Admin.CoreV1().ConfigMaps("kube-public").Get(ctx, "cluster-info", metav1.GetOptions{})
		return err == nil && cm.Data["jws-kubeconfig-"+joinToken.ID] != ""
	}, 30*time.Second, 100*time.Millisecond, "the bootstrap signer did not sign cluster-info")

	join := func(t *testing.T, caHash string) (dryRunDir, stdout, stderr string, err error) {
		p := sandboxJoin(false)
		p.APIServerEndpoint = kube.Host
		p.Token = joinToken.String()
		p.CACertHashes = []string{caHash}
		joinCfg, err := kubeadmconfig.Join(p)
		require.NoError(t, err)
		dir := t.TempDir()
		joinFile := filepath.Join(dir, "join.yaml")
		require.NoError(t, os.WriteFile(joinFile, joinCfg, 0o600))
		dryRunDir = filepath.Join(dir, "dry-run")
		require.NoError(t, os.Mkdir(dryRunDir, 0o700))
		// kubeadm writes what it would write to the node into the dry-run directory.
		stdout, stderr, err = runKubeadm(t, []string{"KUBEADM_JOIN_DRYRUN_DIR=" + dryRunDir}, "join", "--dry-run", "--config", joinFile, "-v=1")
		return dryRunDir, stdout, stderr, err
	}

	t.Run("join", func(t *testing.T) {
		dryRunDir, stdout, stderr, err := join(t, pki.DiscoveryHash(kube.PKI.CA.Cert))
		require.NoError(t, err, "%s%s", stdout, stderr)
		assert.Contains(t, stderr, "Cluster info signature and contents are valid and TLS certificate validates against pinned roots")
		assert.Contains(t, stdout, "This node has joined the cluster")

		kubeletYAML, err := os.ReadFile(filepath.Join(dryRunDir, "config.yaml"))
		require.NoError(t, err)
		kubelet := decodeOne[*kubeletv1beta1.KubeletConfiguration](t, kubeletYAML)
		assert.Equal(t, "/var/lib/kubelet/pki/kubelet.crt", kubelet.TLSCertFile)
		assert.Equal(t, "/var/lib/kubelet/pki/kubelet.key", kubelet.TLSPrivateKeyFile)
		assert.Equal(t, "cgroupfs", kubelet.CgroupDriver)
		assert.Equal(t, ptr.To(false), kubelet.FailSwapOn)
		assert.Equal(t, ptr.To(false), kubelet.Authentication.Anonymous.Enabled)
		assert.Equal(t, ptr.To(true), kubelet.Authentication.Webhook.Enabled)
		assert.Equal(t, kubeletv1beta1.KubeletAuthorizationModeWebhook, kubelet.Authorization.Mode)
		assert.Zero(t, kubelet.ReadOnlyPort)
		assert.True(t, kubelet.RotateCertificates)
		assert.False(t, kubelet.ServerTLSBootstrap)
		assert.Equal(t, []string{"10.96.0.10"}, kubelet.ClusterDNS, "kubeadm adds its defaults")
		assert.Equal(t, criSocket, kubelet.ContainerRuntimeEndpoint, "kubeadm adds the node's CRI socket")

		flags, err := os.ReadFile(filepath.Join(dryRunDir, "kubeadm-flags.env"))
		require.NoError(t, err)
		assert.Contains(t, string(flags), "--node-ip=10.88.0.3")
	})

	t.Run("wrong CA pin", func(t *testing.T) {
		other, err := pki.NewCA("other", time.Now(), time.Hour)
		require.NoError(t, err)
		_, stdout, stderr, err := join(t, pki.DiscoveryHash(other.Cert))
		require.Error(t, err, "kubeadm join accepted a cluster CA that is not pinned:\n%s%s", stdout, stderr)
		assert.Contains(t, stderr, "none of the public keys")
	})
}

// decodeOne strictly decodes one YAML document of kubeadm's or the kubelet's types.
func decodeOne[T runtime.Object](t *testing.T, data []byte) T {
	t.Helper()
	objs := decode(t, data)
	require.Len(t, objs, 1)
	require.IsType(t, *new(T), objs[0])
	return objs[0].(T)
}

// startControllerManager runs the real kube-controller-manager with only the given
// controllers against kube until the test ends.
func startControllerManager(t *testing.T, kube *kubetest.Cluster, controllers ...string) {
	t.Helper()
	bin, err := kubetest.Binary("kube-controller-manager")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "--kubeconfig="+kube.Kubeconfig, "--controllers="+strings.Join(controllers, ","),
		"--leader-elect=false", "--secure-port=0")
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("kube-controller-manager:\n%s", logs.String())
		}
	})
}
