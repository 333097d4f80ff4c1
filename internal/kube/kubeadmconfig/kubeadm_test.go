package kubeadmconfig_test

// Tests against the real kubeadm v1.34.4 (built by hack/build-kube.sh; kubetest finds it), and
// TestKubeadmOfEveryVersionAcceptsConfigs against the kubeadm of every supported version.

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	kubeadmv1beta4 "k8s.io/kubernetes/cmd/kubeadm/app/apis/kubeadm/v1beta4"
	"k8s.io/utils/ptr"

	"github.com/openconstellation/constellation/internal/kube/kubeadmconfig"
	"github.com/openconstellation/constellation/internal/kube/kubeletcred"
	"github.com/openconstellation/constellation/internal/kube/kubetest"
	"github.com/openconstellation/constellation/internal/kubeversion"
	"github.com/openconstellation/constellation/internal/pki"
	"github.com/openconstellation/constellation/internal/testtier"
)

// runKubeadm runs the real kubeadm with args, and env added to the environment, and returns
// its stdout and stderr.
func runKubeadm(t *testing.T, env []string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	testtier.Integration(t, "kubeadm (make kube)")
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
	// kubeadm checks that the discovery file exists.
	file := filepath.Join(t.TempDir(), "discovery.conf")
	require.NoError(t, os.WriteFile(file, []byte("apiVersion: v1\nkind: Config\n"), 0o600))
	join := func(controlPlane, sandbox bool) kubeadmconfig.JoinParams {
		p := sandboxJoin(controlPlane)
		p.Sandbox, p.DiscoveryFile = sandbox, file
		return p
	}
	ipv6 := plainInit()
	ipv6.NodeIP = netip.MustParseAddr("fd00:88::2")
	ipv6.ServiceCIDR = netip.MustParsePrefix("fd00:96::/112")
	ipv6.PodCIDR = netip.MustParsePrefix("fd00:244::/56")

	testCases := map[string]func() ([]byte, error){
		"init sandbox":       func() ([]byte, error) { return kubeadmconfig.Init(sandboxInit()) },
		"init plain":         func() ([]byte, error) { return kubeadmconfig.Init(plainInit()) },
		"init IPv6":          func() ([]byte, error) { return kubeadmconfig.Init(ipv6) },
		"join sandbox":       func() ([]byte, error) { return kubeadmconfig.Join(join(false, true)) },
		"join control plane": func() ([]byte, error) { return kubeadmconfig.Join(join(true, true)) },
		"join plain":         func() ([]byte, error) { return kubeadmconfig.Join(join(false, false)) },
		"upgrade sandbox": func() ([]byte, error) {
			return kubeadmconfig.Upgrade(kubeadmconfig.UpgradeParams{KubernetesVersion: kubetest.Version, Sandbox: true})
		},
		"upgrade plain": func() ([]byte, error) {
			return kubeadmconfig.Upgrade(kubeadmconfig.UpgradeParams{KubernetesVersion: kubetest.Version})
		},
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

// TestKubeadmOfEveryVersionAcceptsConfigs: the kubeadm of every supported Kubernetes version
// accepts the configurations of a cluster of its version, without a warning.
func TestKubeadmOfEveryVersionAcceptsConfigs(t *testing.T) {
	testtier.Integration(t, "the kubeadm of every version (make kube)")
	file := filepath.Join(t.TempDir(), "discovery.conf")
	require.NoError(t, os.WriteFile(file, []byte("apiVersion: v1\nkind: Config\n"), 0o600))
	for _, version := range kubeversion.Versions() {
		dir, err := kubetest.VersionBinDir(version)
		require.NoError(t, err)
		init := sandboxInit()
		init.KubernetesVersion = version
		join := sandboxJoin(true)
		join.DiscoveryFile = file
		for name, generate := range map[string]func() ([]byte, error){
			"init": func() ([]byte, error) { return kubeadmconfig.Init(init) },
			"join": func() ([]byte, error) { return kubeadmconfig.Join(join) },
			"upgrade": func() ([]byte, error) {
				return kubeadmconfig.Upgrade(kubeadmconfig.UpgradeParams{KubernetesVersion: version, Sandbox: true})
			},
		} {
			t.Run(version+"/"+name, func(t *testing.T) {
				data, err := generate()
				require.NoError(t, err)
				cfg := filepath.Join(t.TempDir(), "kubeadm.yaml")
				require.NoError(t, os.WriteFile(cfg, data, 0o600))
				var stdout, stderr bytes.Buffer
				cmd := exec.Command(filepath.Join(dir, "kubeadm"), "config", "validate", "--config", cfg)
				cmd.Stdout, cmd.Stderr = &stdout, &stderr
				require.NoError(t, cmd.Run(), "kubeadm %s config validate:\n%s%s\nconfig:\n%s", version, &stdout, &stderr, data)
				assert.Equal(t, "ok\n", stdout.String())
				assert.NotContains(t, stderr.String(), "WARNING", "kubeadm %s warns about the config:\n%s", version, &stderr)
			})
		}
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
		"discovery file missing": {
			data: joinCfg, // names discoveryFile, which does not exist here
			want: "discovery.file.kubeConfigPath: Invalid value: \"" + discoveryFile + "\": not a valid HTTPS URL or a file on disk",
		},
		"bootstrap token next to the file": {
			data: replace(t, joinCfg, "  file:\n", "  bootstrapToken:\n    token: abcdef.0123456789abcdef\n    apiServerEndpoint: 10.88.0.2:6443\n    unsafeSkipCAVerification: true\n  file:\n"),
			want: "bootstrapToken and file cannot both be set",
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
	p := sandboxJoin(false)
	p.DiscoveryFile = filepath.Join(t.TempDir(), "discovery.conf")
	require.NoError(t, os.WriteFile(p.DiscoveryFile, []byte("apiVersion: v1\nkind: Config\n"), 0o600))
	joinCfg, err := kubeadmconfig.Join(p)
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

// TestKubeadmUploadConfigThenJoin runs, against a real control plane (etcd and
// kube-apiserver), the phase of `kubeadm init` that uploads the cluster-wide configuration,
// with Init's configuration, and then `kubeadm join --dry-run` with Join's: a joining node
// discovers the cluster from the discovery kubeconfig alone (the ticket's API server, CA and
// the node's client certificate), authenticates as itself, and gets Init's kubelet
// configuration. No bootstrap token is involved anywhere.
//
// Limits: dry-run join skips the TLS bootstrap (internal/deploy's TestNodeIdentityAttacks
// runs the renewal it leads to against the real kube-controller-manager); a control-plane
// join cannot be dry-run without the cluster CA keys in /etc/kubernetes/pki. The dry run
// writes only into KUBEADM_JOIN_DRYRUN_DIR; its preflight checks only read the host (their
// failures are ignored: Sandbox).
func TestKubeadmUploadConfigThenJoin(t *testing.T) {
	kube := kubetest.Start(t, kubetest.Options{})
	ctx := context.Background()
	dir := t.TempDir()
	initCfg, err := kubeadmconfig.Init(sandboxInit())
	require.NoError(t, err)
	initFile := filepath.Join(dir, "init.yaml")
	require.NoError(t, os.WriteFile(initFile, initCfg, 0o600))

	// 1. kubeadm init's upload-config phase: the cluster-wide configuration joining nodes get.
	stdout, stderr, err := runKubeadm(t, nil, "init", "phase", "upload-config", "all", "--config", initFile, "--kubeconfig", kube.Kubeconfig)
	require.NoError(t, err, "%s%s", stdout, stderr)
	kubeadmCM, err := kube.Admin.CoreV1().ConfigMaps("kube-system").Get(ctx, "kubeadm-config", metav1.GetOptions{})
	require.NoError(t, err)
	cluster := decodeOne[*kubeadmv1beta4.ClusterConfiguration](t, []byte(kubeadmCM.Data["ClusterConfiguration"]))
	assert.Equal(t, "10.88.0.2:6443", cluster.ControlPlaneEndpoint)
	assert.Equal(t, kubeadmv1beta4.EncryptionAlgorithmECDSAP256, cluster.EncryptionAlgorithm)
	assert.Contains(t, cluster.APIServer.ExtraArgs, kubeadmv1beta4.Arg{Name: "kubelet-certificate-authority", Value: "/etc/kubernetes/pki/ca.crt"})
	assert.Contains(t, cluster.ControllerManager.ExtraArgs, kubeadmv1beta4.Arg{Name: "cluster-signing-duration", Value: "24h0m0s"})
	assert.Equal(t, "10.244.0.0/16", cluster.Networking.PodSubnet)
	// Nothing of bootstrap tokens: the phase that would create the token, cluster-info and
	// the rules approving any node name for a token is skipped at init.
	_, err = kube.Admin.CoreV1().ConfigMaps("kube-public").Get(ctx, "cluster-info", metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err), "%v", err)

	// 2. kubeadm join --dry-run with the discovery file a join ticket becomes.
	join := func(t *testing.T, ca *pki.CA, name string, discoveryTimeout time.Duration) (dryRunDir, stdout, stderr string, err error) {
		certPEM, keyPEM, err := kubeletcred.Issue(ca, name, time.Now())
		require.NoError(t, err)
		discovery, err := kubeletcred.Kubeconfig(kubeletcred.KubeconfigParams{
			Server: kube.Host, NodeName: name, CACert: pki.EncodeCert(ca.Cert), ClientCert: certPEM, ClientKey: keyPEM,
		})
		require.NoError(t, err)
		dir := t.TempDir()
		p := sandboxJoin(false)
		p.NodeName = name
		p.DiscoveryFile = filepath.Join(dir, "discovery.conf")
		require.NoError(t, os.WriteFile(p.DiscoveryFile, discovery, 0o600))
		joinCfg, err := kubeadmconfig.Join(p)
		require.NoError(t, err)
		if discoveryTimeout > 0 {
			// kubeadm retries discovery until this timeout (5 minutes by default).
			require.NotContains(t, string(joinCfg), "timeouts:")
			joinCfg = append(joinCfg, fmt.Sprintf("timeouts:\n  discovery: %s\n", discoveryTimeout)...)
		}
		joinFile := filepath.Join(dir, "join.yaml")
		require.NoError(t, os.WriteFile(joinFile, joinCfg, 0o600))
		dryRunDir = filepath.Join(dir, "dry-run")
		require.NoError(t, os.Mkdir(dryRunDir, 0o700))
		// kubeadm writes what it would write to the node into the dry-run directory.
		stdout, stderr, err = runKubeadm(t, []string{"KUBEADM_JOIN_DRYRUN_DIR=" + dryRunDir}, "join", "--dry-run", "--config", joinFile, "-v=1")
		return dryRunDir, stdout, stderr, err
	}

	t.Run("join", func(t *testing.T) {
		dryRunDir, stdout, stderr, err := join(t, kube.PKI.CA, "node-1", 0)
		require.NoError(t, err, "%s%s", stdout, stderr)
		assert.Contains(t, stderr, "Using authentication credentials from the discovery file")
		assert.Contains(t, stdout, "This node has joined the cluster")
		assert.NotContains(t, stderr, "TLSBootstrapToken", "the TLS bootstrap authenticates with the node's certificate")

		kubeletYAML, err := os.ReadFile(filepath.Join(dryRunDir, "config.yaml"))
		require.NoError(t, err)
		kubelet := decodeOne[*kubeletv1beta1.KubeletConfiguration](t, kubeletYAML)
		assert.Equal(t, "/var/lib/kubelet/pki/kubelet.crt", kubelet.TLSCertFile)
		assert.Equal(t, "/var/lib/kubelet/pki/kubelet.key", kubelet.TLSPrivateKeyFile)
		assert.Equal(t, "cgroupfs", kubelet.CgroupDriver)
		assert.Equal(t, ptr.To(false), kubelet.FailSwapOn)
		assert.Equal(t, ptr.To(false), kubelet.FailCgroupV1, "the host may have cgroup v1")
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

	t.Run("discovery file of another cluster's CA", func(t *testing.T) {
		other, err := pki.NewCA("other", time.Now(), time.Hour)
		require.NoError(t, err)
		_, stdout, stderr, err := join(t, other, "node-1", 3*time.Second)
		require.Error(t, err, "kubeadm join accepted an API server its CA did not sign:\n%s%s", stdout, stderr)
		assert.Contains(t, stderr, "x509: certificate signed by unknown authority")
		assert.NotContains(t, stdout, "This node has joined the cluster")
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
