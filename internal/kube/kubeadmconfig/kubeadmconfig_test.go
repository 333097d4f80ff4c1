package kubeadmconfig_test

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	serializerjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	kubeproxyv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	kubeadmv1beta4 "k8s.io/kubernetes/cmd/kubeadm/app/apis/kubeadm/v1beta4"
	"k8s.io/utils/ptr"

	"github.com/openconstellation/constellation/internal/kube/kubeadmconfig"
)

const (
	criSocket     = "unix:///run/containerd/containerd.sock"
	discoveryFile = "/etc/kubernetes/constellation-join.conf"
)

var (
	initMeta    = metav1.TypeMeta{APIVersion: "kubeadm.k8s.io/v1beta4", Kind: "InitConfiguration"}
	clusterMeta = metav1.TypeMeta{APIVersion: "kubeadm.k8s.io/v1beta4", Kind: "ClusterConfiguration"}
	joinMeta    = metav1.TypeMeta{APIVersion: "kubeadm.k8s.io/v1beta4", Kind: "JoinConfiguration"}
	kubeletMeta = metav1.TypeMeta{APIVersion: "kubelet.config.k8s.io/v1beta1", Kind: "KubeletConfiguration"}

	controlPlaneTaint = corev1.Taint{Key: "node-role.kubernetes.io/control-plane", Effect: corev1.TaintEffectNoSchedule}
	// No bootstrap token: kubeadm init's phase that creates one (and the rule approving any
	// node name for it) is skipped.
	skipPhases = []string{"bootstrap-token", "show-join-command"}
	// Profiling off, local component endpoints on loopback.
	localComponent = kubeadmv1beta4.ControlPlaneComponent{ExtraArgs: []kubeadmv1beta4.Arg{
		{Name: "profiling", Value: "false"}, {Name: "bind-address", Value: "127.0.0.1"},
	}}
	// The removed-node authorizer's files, mounted into the API server.
	authorizerVolume = []kubeadmv1beta4.HostPathMount{{
		Name: "constellation-authorization", HostPath: "/etc/kubernetes/constellation", MountPath: "/etc/kubernetes/constellation",
		ReadOnly: true, PathType: corev1.HostPathDirectory,
	}}
	// The controller manager also signs the certificates kubelets renew theirs to for a day.
	controllerManager = kubeadmv1beta4.ControlPlaneComponent{ExtraArgs: []kubeadmv1beta4.Arg{
		{Name: "profiling", Value: "false"}, {Name: "bind-address", Value: "127.0.0.1"},
		{Name: "cluster-signing-duration", Value: "24h0m0s"},
		{Name: "kube-api-qps", Value: "100"}, {Name: "kube-api-burst", Value: "200"},
	}}
	// The kubelet settings every variant has.
	kubeletAuth = kubeletv1beta1.KubeletAuthentication{
		X509:      kubeletv1beta1.KubeletX509Authentication{ClientCAFile: "/etc/kubernetes/pki/ca.crt"},
		Webhook:   kubeletv1beta1.KubeletWebhookAuthentication{Enabled: ptr.To(true)},
		Anonymous: kubeletv1beta1.KubeletAnonymousAuthentication{Enabled: ptr.To(false)},
	}
	kubeletAuthz = kubeletv1beta1.KubeletAuthorization{Mode: kubeletv1beta1.KubeletAuthorizationModeWebhook}
)

// sandboxInit is what the local provider's first node uses.
func sandboxInit() kubeadmconfig.InitParams {
	return kubeadmconfig.InitParams{
		NodeName:           "cp-0",
		NodeIP:             netip.MustParseAddr("10.88.0.2"),
		ClusterName:        "constell",
		KubernetesVersion:  "v1.34.4",
		APIServerCertSANs:  []string{"api.constell.example", "192.0.2.10"},
		ServiceCIDR:        netip.MustParsePrefix("10.96.0.0/12"),
		PodCIDR:            netip.MustParsePrefix("10.244.0.0/16"),
		CRISocket:          criSocket,
		Sandbox:            true,
		KubeletServingCert: true,
	}
}

// plainInit sets only the required parameters.
func plainInit() kubeadmconfig.InitParams {
	return kubeadmconfig.InitParams{
		NodeName:          "cp-0",
		NodeIP:            netip.MustParseAddr("10.88.0.2"),
		KubernetesVersion: "v1.34.4",
		ServiceCIDR:       netip.MustParsePrefix("10.96.0.0/12"),
		CRISocket:         criSocket,
	}
}

func sandboxJoin(controlPlane bool) kubeadmconfig.JoinParams {
	return kubeadmconfig.JoinParams{
		NodeName:      "node-1",
		NodeIP:        netip.MustParseAddr("10.88.0.3"),
		CRISocket:     criSocket,
		DiscoveryFile: discoveryFile,
		ControlPlane:  controlPlane,
		Sandbox:       true,
	}
}

// decode strictly decodes every document of a multi-document YAML file into kubeadm's and
// the kubelet's versioned types (unknown or duplicate fields fail).
func decode(t *testing.T, data []byte) []runtime.Object {
	t.Helper()
	scheme := runtime.NewScheme()
	require.NoError(t, kubeadmv1beta4.AddToScheme(scheme))
	require.NoError(t, kubeletv1beta1.AddToScheme(scheme))
	require.NoError(t, kubeproxyv1alpha1.AddToScheme(scheme))
	yaml := serializerjson.NewSerializerWithOptions(serializerjson.DefaultMetaFactory, scheme, scheme, serializerjson.SerializerOptions{Yaml: true, Strict: true})
	var objs []runtime.Object
	for doc := range strings.SplitSeq(string(data), "\n---\n") {
		obj, _, err := yaml.Decode([]byte(doc), nil, nil)
		require.NoError(t, err, "document:\n%s", doc)
		objs = append(objs, obj)
	}
	return objs
}

func TestInit(t *testing.T) {
	testCases := map[string]struct {
		params  kubeadmconfig.InitParams
		init    *kubeadmv1beta4.InitConfiguration
		cluster *kubeadmv1beta4.ClusterConfiguration
		kubelet *kubeletv1beta1.KubeletConfiguration
	}{
		"sandbox with every option": {
			params: func() kubeadmconfig.InitParams {
				p := sandboxInit()
				p.ControlPlaneEndpoint = "api.constell.example:7443"
				p.ImageRepository = "registry.local/k8s"
				return p
			}(),
			init: &kubeadmv1beta4.InitConfiguration{
				TypeMeta:   initMeta,
				SkipPhases: skipPhases,
				NodeRegistration: kubeadmv1beta4.NodeRegistrationOptions{
					Name:                  "cp-0",
					CRISocket:             criSocket,
					Taints:                []corev1.Taint{controlPlaneTaint},
					KubeletExtraArgs:      []kubeadmv1beta4.Arg{{Name: "node-ip", Value: "10.88.0.2"}},
					IgnorePreflightErrors: []string{"all"},
					ImagePullPolicy:       corev1.PullNever,
				},
				LocalAPIEndpoint: kubeadmv1beta4.APIEndpoint{AdvertiseAddress: "10.88.0.2", BindPort: 6443},
			},
			cluster: &kubeadmv1beta4.ClusterConfiguration{
				TypeMeta:             clusterMeta,
				Etcd:                 kubeadmv1beta4.Etcd{Local: &kubeadmv1beta4.LocalEtcd{DataDir: "/var/lib/etcd"}},
				Networking:           kubeadmv1beta4.Networking{ServiceSubnet: "10.96.0.0/12", PodSubnet: "10.244.0.0/16"},
				KubernetesVersion:    "v1.34.4",
				ControlPlaneEndpoint: "api.constell.example:7443",
				APIServer: kubeadmv1beta4.APIServer{
					ControlPlaneComponent: kubeadmv1beta4.ControlPlaneComponent{ExtraArgs: []kubeadmv1beta4.Arg{
						{Name: "profiling", Value: "false"},
						{Name: "authorization-config", Value: "/etc/kubernetes/constellation/authorization.yaml"},
						{Name: "kubelet-certificate-authority", Value: "/etc/kubernetes/pki/ca.crt"},
					}, ExtraVolumes: authorizerVolume},
					CertSANs: []string{"api.constell.example", "192.0.2.10"},
				},
				ControllerManager:   controllerManager,
				Scheduler:           localComponent,
				CertificatesDir:     "/etc/kubernetes/pki",
				ImageRepository:     "registry.local/k8s",
				ClusterName:         "constell",
				EncryptionAlgorithm: "ECDSA-P256",
			},
			kubelet: &kubeletv1beta1.KubeletConfiguration{
				TypeMeta:           kubeletMeta,
				Authentication:     kubeletAuth,
				Authorization:      kubeletAuthz,
				RotateCertificates: true,
				TLSCertFile:        "/var/lib/kubelet/pki/kubelet.crt",
				TLSPrivateKeyFile:  "/var/lib/kubelet/pki/kubelet.key",
				CgroupDriver:       "cgroupfs",
				FailSwapOn:         ptr.To(false),
				FailCgroupV1:       ptr.To(false),
			},
		},
		"required parameters only": {
			params: plainInit(),
			init: &kubeadmv1beta4.InitConfiguration{
				TypeMeta:   initMeta,
				SkipPhases: skipPhases,
				NodeRegistration: kubeadmv1beta4.NodeRegistrationOptions{
					Name:             "cp-0",
					CRISocket:        criSocket,
					Taints:           []corev1.Taint{controlPlaneTaint},
					KubeletExtraArgs: []kubeadmv1beta4.Arg{{Name: "node-ip", Value: "10.88.0.2"}},
				},
				LocalAPIEndpoint: kubeadmv1beta4.APIEndpoint{AdvertiseAddress: "10.88.0.2", BindPort: 6443},
			},
			cluster: &kubeadmv1beta4.ClusterConfiguration{
				TypeMeta:             clusterMeta,
				Etcd:                 kubeadmv1beta4.Etcd{Local: &kubeadmv1beta4.LocalEtcd{DataDir: "/var/lib/etcd"}},
				Networking:           kubeadmv1beta4.Networking{ServiceSubnet: "10.96.0.0/12"},
				KubernetesVersion:    "v1.34.4",
				ControlPlaneEndpoint: "10.88.0.2:6443",
				APIServer: kubeadmv1beta4.APIServer{
					ControlPlaneComponent: kubeadmv1beta4.ControlPlaneComponent{ExtraArgs: []kubeadmv1beta4.Arg{
						{Name: "profiling", Value: "false"},
						{Name: "authorization-config", Value: "/etc/kubernetes/constellation/authorization.yaml"},
					}, ExtraVolumes: authorizerVolume},
				},
				ControllerManager:   controllerManager,
				Scheduler:           localComponent,
				CertificatesDir:     "/etc/kubernetes/pki",
				EncryptionAlgorithm: "ECDSA-P256",
			},
			kubelet: &kubeletv1beta1.KubeletConfiguration{
				TypeMeta:           kubeletMeta,
				Authentication:     kubeletAuth,
				Authorization:      kubeletAuthz,
				RotateCertificates: true,
			},
		},
		"IPv6": {
			params: func() kubeadmconfig.InitParams {
				p := plainInit()
				p.NodeIP = netip.MustParseAddr("fd00:88::2")
				p.ServiceCIDR = netip.MustParsePrefix("fd00:96::/112")
				p.PodCIDR = netip.MustParsePrefix("fd00:244::/56")
				return p
			}(),
			init: &kubeadmv1beta4.InitConfiguration{
				TypeMeta:   initMeta,
				SkipPhases: skipPhases,
				NodeRegistration: kubeadmv1beta4.NodeRegistrationOptions{
					Name:             "cp-0",
					CRISocket:        criSocket,
					Taints:           []corev1.Taint{controlPlaneTaint},
					KubeletExtraArgs: []kubeadmv1beta4.Arg{{Name: "node-ip", Value: "fd00:88::2"}},
				},
				LocalAPIEndpoint: kubeadmv1beta4.APIEndpoint{AdvertiseAddress: "fd00:88::2", BindPort: 6443},
			},
			cluster: &kubeadmv1beta4.ClusterConfiguration{
				TypeMeta:             clusterMeta,
				Etcd:                 kubeadmv1beta4.Etcd{Local: &kubeadmv1beta4.LocalEtcd{DataDir: "/var/lib/etcd"}},
				Networking:           kubeadmv1beta4.Networking{ServiceSubnet: "fd00:96::/112", PodSubnet: "fd00:244::/56"},
				KubernetesVersion:    "v1.34.4",
				ControlPlaneEndpoint: "[fd00:88::2]:6443",
				APIServer: kubeadmv1beta4.APIServer{
					ControlPlaneComponent: kubeadmv1beta4.ControlPlaneComponent{ExtraArgs: []kubeadmv1beta4.Arg{
						{Name: "profiling", Value: "false"},
						{Name: "authorization-config", Value: "/etc/kubernetes/constellation/authorization.yaml"},
					}, ExtraVolumes: authorizerVolume},
				},
				ControllerManager:   controllerManager,
				Scheduler:           localComponent,
				CertificatesDir:     "/etc/kubernetes/pki",
				EncryptionAlgorithm: "ECDSA-P256",
			},
			kubelet: &kubeletv1beta1.KubeletConfiguration{
				TypeMeta:           kubeletMeta,
				Authentication:     kubeletAuth,
				Authorization:      kubeletAuthz,
				RotateCertificates: true,
			},
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			data, err := kubeadmconfig.Init(tc.params)
			require.NoError(t, err)
			objs := decode(t, data)
			require.Len(t, objs, 4)
			require.IsType(t, &kubeproxyv1alpha1.KubeProxyConfiguration{}, objs[3])
			require.IsType(t, &kubeadmv1beta4.InitConfiguration{}, objs[0])
			require.IsType(t, &kubeadmv1beta4.ClusterConfiguration{}, objs[1])
			require.IsType(t, &kubeletv1beta1.KubeletConfiguration{}, objs[2])
			// The logging options hold resource quantities, which decode to a different but
			// equal representation: compare them by value, then the rest of the struct.
			kubelet := objs[2].(*kubeletv1beta1.KubeletConfiguration)
			assert.True(t, kubelet.Logging.Options.Text.InfoBufferSize.IsZero())
			assert.True(t, kubelet.Logging.Options.JSON.InfoBufferSize.IsZero())
			kubelet.Logging.Options = tc.kubelet.Logging.Options
			assert.Equal(t, tc.init, objs[0])
			assert.Equal(t, tc.cluster, objs[1])
			assert.Equal(t, tc.kubelet, objs[2])
			// Zero values the kubelet treats as defaults are not visible in the structs.
			assert.NotContains(t, string(data), "readOnlyPort")
			assert.NotContains(t, string(data), "serverTLSBootstrap")
			assert.NotContains(t, string(data), "protectKernelDefaults")

			again, err := kubeadmconfig.Init(tc.params)
			require.NoError(t, err)
			assert.Equal(t, data, again, "deterministic")
		})
	}
}

func TestJoin(t *testing.T) {
	discovery := kubeadmv1beta4.Discovery{File: &kubeadmv1beta4.FileDiscovery{KubeConfigPath: discoveryFile}}
	testCases := map[string]struct {
		params kubeadmconfig.JoinParams
		want   *kubeadmv1beta4.JoinConfiguration
	}{
		"sandbox worker": {
			params: sandboxJoin(false),
			want: &kubeadmv1beta4.JoinConfiguration{
				TypeMeta: joinMeta,
				NodeRegistration: kubeadmv1beta4.NodeRegistrationOptions{
					Name:                  "node-1",
					CRISocket:             criSocket,
					Taints:                []corev1.Taint{},
					KubeletExtraArgs:      []kubeadmv1beta4.Arg{{Name: "node-ip", Value: "10.88.0.3"}},
					IgnorePreflightErrors: []string{"all"},
					ImagePullPolicy:       corev1.PullNever,
				},
				Discovery: discovery,
			},
		},
		"sandbox control plane": {
			params: sandboxJoin(true),
			want: &kubeadmv1beta4.JoinConfiguration{
				TypeMeta: joinMeta,
				NodeRegistration: kubeadmv1beta4.NodeRegistrationOptions{
					Name:                  "node-1",
					CRISocket:             criSocket,
					Taints:                []corev1.Taint{controlPlaneTaint},
					KubeletExtraArgs:      []kubeadmv1beta4.Arg{{Name: "node-ip", Value: "10.88.0.3"}},
					IgnorePreflightErrors: []string{"all"},
					ImagePullPolicy:       corev1.PullNever,
				},
				Discovery: discovery,
				ControlPlane: &kubeadmv1beta4.JoinControlPlane{
					LocalAPIEndpoint: kubeadmv1beta4.APIEndpoint{AdvertiseAddress: "10.88.0.3", BindPort: 6443},
				},
			},
		},
		"plain worker": {
			params: func() kubeadmconfig.JoinParams {
				p := sandboxJoin(false)
				p.Sandbox = false
				return p
			}(),
			want: &kubeadmv1beta4.JoinConfiguration{
				TypeMeta: joinMeta,
				NodeRegistration: kubeadmv1beta4.NodeRegistrationOptions{
					Name:             "node-1",
					CRISocket:        criSocket,
					Taints:           []corev1.Taint{},
					KubeletExtraArgs: []kubeadmv1beta4.Arg{{Name: "node-ip", Value: "10.88.0.3"}},
				},
				Discovery: discovery,
			},
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			data, err := kubeadmconfig.Join(tc.params)
			require.NoError(t, err)
			objs := decode(t, data)
			require.Len(t, objs, 1, "only a JoinConfiguration: kubeadm join ignores other documents")
			assert.Equal(t, tc.want, objs[0])
			assert.NotContains(t, string(data), "unsafeSkipCAVerification")
			assert.NotContains(t, string(data), "token", "no bootstrap token: the node joins with its own client certificate")
		})
	}
}

func TestInitInvalid(t *testing.T) {
	testCases := map[string]struct {
		change func(*kubeadmconfig.InitParams)
		want   []string
	}{
		"missing node name": {func(p *kubeadmconfig.InitParams) { p.NodeName = "" }, []string{"NodeName: required"}},
		"node name not DNS": {func(p *kubeadmconfig.InitParams) { p.NodeName = "CP_0" }, []string{`NodeName "CP_0"`}},
		"missing node IP":   {func(p *kubeadmconfig.InitParams) { p.NodeIP = netip.Addr{} }, []string{"NodeIP: required"}},
		"loopback node IP": {func(p *kubeadmconfig.InitParams) { p.NodeIP = netip.MustParseAddr("127.0.0.1") },
			[]string{"NodeIP 127.0.0.1: not a global unicast address"}},
		"link-local node IP": {func(p *kubeadmconfig.InitParams) { p.NodeIP = netip.MustParseAddr("fe80::1") },
			[]string{"NodeIP fe80::1", "ServiceCIDR: 10.96.0.0/12 is not in NodeIP's IP family", "PodCIDR: 10.244.0.0/16 is not in NodeIP's IP family"}},
		"cluster name":  {func(p *kubeadmconfig.InitParams) { p.ClusterName = "My Cluster" }, []string{`ClusterName "My Cluster"`}},
		"no version":    {func(p *kubeadmconfig.InitParams) { p.KubernetesVersion = "" }, []string{`KubernetesVersion ""`}},
		"bad version":   {func(p *kubeadmconfig.InitParams) { p.KubernetesVersion = "1.34.4" }, []string{`KubernetesVersion "1.34.4"`}},
		"channel label": {func(p *kubeadmconfig.InitParams) { p.KubernetesVersion = "stable-1" }, []string{`KubernetesVersion "stable-1"`}},
		"endpoint without port": {func(p *kubeadmconfig.InitParams) { p.ControlPlaneEndpoint = "10.88.0.2" },
			[]string{"ControlPlaneEndpoint: want host:port"}},
		"endpoint port range": {func(p *kubeadmconfig.InitParams) { p.ControlPlaneEndpoint = "api.example:70000" },
			[]string{`ControlPlaneEndpoint: port "70000"`}},
		"endpoint host": {func(p *kubeadmconfig.InitParams) { p.ControlPlaneEndpoint = "bad_host:6443" },
			[]string{`ControlPlaneEndpoint: host "bad_host"`}},
		"SAN": {func(p *kubeadmconfig.InitParams) { p.APIServerCertSANs = []string{"ok.example", "not ok"} },
			[]string{`APIServerCertSANs: "not ok"`}},
		"missing service CIDR": {func(p *kubeadmconfig.InitParams) { p.ServiceCIDR = netip.Prefix{} }, []string{"ServiceCIDR: required"}},
		"service CIDR host bits": {func(p *kubeadmconfig.InitParams) { p.ServiceCIDR = netip.MustParsePrefix("10.96.0.1/12") },
			[]string{"ServiceCIDR: 10.96.0.1/12 has host bits set"}},
		"service CIDR too large": {func(p *kubeadmconfig.InitParams) { p.ServiceCIDR = netip.MustParsePrefix("11.0.0.0/8") },
			[]string{"ServiceCIDR 11.0.0.0/8: 24 host bits"}},
		"service CIDR too small": {func(p *kubeadmconfig.InitParams) { p.ServiceCIDR = netip.MustParsePrefix("10.96.0.0/29") },
			[]string{"ServiceCIDR 10.96.0.0/29: 3 host bits"}},
		"pod CIDR family": {func(p *kubeadmconfig.InitParams) { p.PodCIDR = netip.MustParsePrefix("fd00::/56") },
			[]string{"PodCIDR: fd00::/56 is not in NodeIP's IP family"}},
		"pod CIDR smaller than a node's": {func(p *kubeadmconfig.InitParams) { p.PodCIDR = netip.MustParsePrefix("10.244.0.0/25") },
			[]string{"PodCIDR 10.244.0.0/25: prefix length must be 8 to 24"}},
		"pod CIDR overlaps services": {func(p *kubeadmconfig.InitParams) { p.PodCIDR = netip.MustParsePrefix("10.96.0.0/16") },
			[]string{"PodCIDR 10.96.0.0/16 overlaps ServiceCIDR 10.96.0.0/12"}},
		"CRI socket without scheme": {func(p *kubeadmconfig.InitParams) { p.CRISocket = "/run/containerd/containerd.sock" },
			[]string{`CRISocket "/run/containerd/containerd.sock"`}},
		"CRI socket relative": {func(p *kubeadmconfig.InitParams) { p.CRISocket = "unix://run/containerd.sock" },
			[]string{`CRISocket "unix://run/containerd.sock"`}},
		"several at once": {
			func(p *kubeadmconfig.InitParams) {
				p.NodeName, p.NodeIP, p.KubernetesVersion, p.CRISocket = "", netip.Addr{}, "", ""
			},
			[]string{"NodeName: required", "NodeIP: required", `KubernetesVersion ""`, `CRISocket ""`},
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			p := sandboxInit()
			tc.change(&p)
			data, err := kubeadmconfig.Init(p)
			require.Error(t, err)
			assert.Nil(t, data)
			for _, want := range tc.want {
				assert.ErrorContains(t, err, want)
			}
			assert.Len(t, strings.Split(err.Error(), "\n"), len(tc.want), "exactly the expected problems: %v", err)
		})
	}
}

func TestJoinInvalid(t *testing.T) {
	testCases := map[string]struct {
		change func(*kubeadmconfig.JoinParams)
		want   []string
	}{
		"missing node name":  {func(p *kubeadmconfig.JoinParams) { p.NodeName = "" }, []string{"NodeName: required"}},
		"node IP":            {func(p *kubeadmconfig.JoinParams) { p.NodeIP = netip.MustParseAddr("0.0.0.0") }, []string{"NodeIP 0.0.0.0"}},
		"CRI socket":         {func(p *kubeadmconfig.JoinParams) { p.CRISocket = "" }, []string{`CRISocket ""`}},
		"no discovery file":  {func(p *kubeadmconfig.JoinParams) { p.DiscoveryFile = "" }, []string{`DiscoveryFile "": want a clean absolute path`}},
		"relative discovery": {func(p *kubeadmconfig.JoinParams) { p.DiscoveryFile = "join.conf" }, []string{`DiscoveryFile "join.conf"`}},
		"unclean discovery":  {func(p *kubeadmconfig.JoinParams) { p.DiscoveryFile = "/etc/../join.conf" }, []string{`DiscoveryFile "/etc/../join.conf"`}},
		"several at once": {
			func(p *kubeadmconfig.JoinParams) { p.NodeIP, p.DiscoveryFile = netip.Addr{}, "x" },
			[]string{"NodeIP: required", `DiscoveryFile "x"`},
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			p := sandboxJoin(true)
			tc.change(&p)
			data, err := kubeadmconfig.Join(p)
			require.Error(t, err)
			assert.Nil(t, data)
			for _, want := range tc.want {
				assert.ErrorContains(t, err, want)
			}
			assert.Len(t, strings.Split(err.Error(), "\n"), len(tc.want), "exactly the expected problems: %v", err)
		})
	}
}

// TestIPv4MappedNodeIP checks that an IPv4-mapped IPv6 node address counts as IPv4.
func TestIPv4MappedNodeIP(t *testing.T) {
	mapped := sandboxInit()
	mapped.NodeIP = netip.MustParseAddr("::ffff:10.88.0.2")
	got, err := kubeadmconfig.Init(mapped)
	require.NoError(t, err)
	want, err := kubeadmconfig.Init(sandboxInit())
	require.NoError(t, err)
	assert.Equal(t, string(want), string(got))

	mappedJoin := sandboxJoin(true)
	mappedJoin.NodeIP = netip.MustParseAddr("::ffff:10.88.0.3")
	got, err = kubeadmconfig.Join(mappedJoin)
	require.NoError(t, err)
	want, err = kubeadmconfig.Join(sandboxJoin(true))
	require.NoError(t, err)
	assert.Equal(t, string(want), string(got))
}

// TestDocumentsSeparated checks the multi-document layout kubeadm splits on.
func TestDocumentsSeparated(t *testing.T) {
	data, err := kubeadmconfig.Init(sandboxInit())
	require.NoError(t, err)
	assert.Equal(t, 3, bytes.Count(data, []byte("\n---\n")))
	assert.True(t, bytes.HasPrefix(data, []byte("apiVersion: kubeadm.k8s.io/v1beta4\n")))
}

// TestKubeProxySandbox checks kube-proxy's settings: nftables everywhere, and in a sandbox
// no conntrack sizing (the host's table is not the node's to set).
func TestKubeProxySandbox(t *testing.T) {
	for _, sandbox := range []bool{true, false} {
		p := sandboxInit()
		p.Sandbox = sandbox
		data, err := kubeadmconfig.Init(p)
		require.NoError(t, err)
		docs := bytes.Split(data, []byte("\n---\n"))
		proxy := string(docs[len(docs)-1])
		assert.Contains(t, proxy, "kind: KubeProxyConfiguration")
		assert.Contains(t, proxy, "mode: nftables")
		assert.Equal(t, sandbox, strings.Contains(proxy, "maxPerCore: 0"), "sandbox=%v:\n%s", sandbox, proxy)
	}
}

func TestUpgrade(t *testing.T) {
	upgradeMeta := metav1.TypeMeta{APIVersion: "kubeadm.k8s.io/v1beta4", Kind: "UpgradeConfiguration"}
	testCases := map[string]struct {
		params  kubeadmconfig.UpgradeParams
		want    *kubeadmv1beta4.UpgradeConfiguration
		wantErr string
	}{
		"sandbox": {
			params: kubeadmconfig.UpgradeParams{KubernetesVersion: "v1.35.4", Sandbox: true},
			want: &kubeadmv1beta4.UpgradeConfiguration{
				TypeMeta: upgradeMeta,
				Apply: kubeadmv1beta4.UpgradeApplyConfiguration{
					KubernetesVersion: "v1.35.4", SkipPhases: []string{"bootstrap-token"},
					CertificateRenewal: ptr.To(false), EtcdUpgrade: ptr.To(false),
					IgnorePreflightErrors: []string{"all"}, ImagePullPolicy: corev1.PullNever,
				},
				Node: kubeadmv1beta4.UpgradeNodeConfiguration{
					CertificateRenewal: ptr.To(false), EtcdUpgrade: ptr.To(false),
					IgnorePreflightErrors: []string{"all"}, ImagePullPolicy: corev1.PullNever,
				},
			},
		},
		"plain": {
			params: kubeadmconfig.UpgradeParams{KubernetesVersion: "v1.35.4"},
			want: &kubeadmv1beta4.UpgradeConfiguration{
				TypeMeta: upgradeMeta,
				Apply: kubeadmv1beta4.UpgradeApplyConfiguration{
					KubernetesVersion: "v1.35.4", SkipPhases: []string{"bootstrap-token"},
					CertificateRenewal: ptr.To(false), EtcdUpgrade: ptr.To(false),
				},
				Node: kubeadmv1beta4.UpgradeNodeConfiguration{CertificateRenewal: ptr.To(false), EtcdUpgrade: ptr.To(false)},
			},
		},
		"no version":  {params: kubeadmconfig.UpgradeParams{}, wantErr: `KubernetesVersion ""`},
		"bad version": {params: kubeadmconfig.UpgradeParams{KubernetesVersion: "1.35"}, wantErr: `KubernetesVersion "1.35"`},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			data, err := kubeadmconfig.Upgrade(tc.params)
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			objs := decode(t, data)
			require.Len(t, objs, 1)
			assert.Equal(t, tc.want, objs[0])
		})
	}
}

// A machine's longer wait for the components reaches kubeadm's timeouts, at init and join;
// without it kubeadm keeps its defaults.
func TestComponentWait(t *testing.T) {
	init := sandboxInit()
	init.ComponentWait = 15 * time.Minute
	data, err := kubeadmconfig.Init(init)
	require.NoError(t, err)
	initCfg := decode(t, data)[0].(*kubeadmv1beta4.InitConfiguration)
	require.NotNil(t, initCfg.Timeouts)
	assert.Equal(t, 15*time.Minute, initCfg.Timeouts.ControlPlaneComponentHealthCheck.Duration)
	assert.Equal(t, 15*time.Minute, initCfg.Timeouts.KubeletHealthCheck.Duration)

	join := sandboxJoin(true)
	join.ComponentWait = 15 * time.Minute
	data, err = kubeadmconfig.Join(join)
	require.NoError(t, err)
	joinCfg := decode(t, data)[0].(*kubeadmv1beta4.JoinConfiguration)
	require.NotNil(t, joinCfg.Timeouts)
	assert.Equal(t, 15*time.Minute, joinCfg.Timeouts.ControlPlaneComponentHealthCheck.Duration)

	data, err = kubeadmconfig.Init(sandboxInit())
	require.NoError(t, err)
	assert.Nil(t, decode(t, data)[0].(*kubeadmv1beta4.InitConfiguration).Timeouts, "kubeadm's defaults")
}
