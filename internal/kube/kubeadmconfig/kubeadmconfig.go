// Package kubeadmconfig generates the kubeadm configuration files (API kubeadm.k8s.io/v1beta4)
// the bootstrapper passes to `kubeadm init --config` on the first control-plane node and to
// `kubeadm join --config` on every other node. It fills kubeadm's own versioned types
// (k8s.io/kubernetes/cmd/kubeadm/app/apis/kubeadm/v1beta4, KubeletConfiguration from
// k8s.io/kubelet/config/v1beta1) and encodes them with an apimachinery YAML serializer, so the
// documents carry apiVersion and kind and can only contain fields kubeadm knows. Parameters are
// validated first; every problem is reported (errors.Join), each naming its parameter.
//
// # Documents
//
// Init returns InitConfiguration, ClusterConfiguration and KubeletConfiguration. Join returns
// only a JoinConfiguration: `kubeadm join` ignores every other document in its config file
// (real kubeadm v1.34.4 logs "[config] WARNING: Ignored configuration document with
// GroupVersionKind kubelet.config.k8s.io/v1beta1, Kind=KubeletConfiguration"; `kubeadm config
// validate` accepts such a file without even decoding that document). A joining node's kubelet
// configuration is the cluster-wide one `kubeadm init` uploaded (ConfigMap
// kube-system/kubelet-config), plus kubeadm's defaults and the node's CRI socket; the tests
// check this with `kubeadm join --dry-run` against a real API server. Hence everything in
// KubeletConfiguration here is cluster-wide: the Sandbox kubelet settings and the kubelet
// serving-certificate paths are chosen once, in InitParams, and JoinParams has no kubelet
// settings. (Per-node kubelet changes would need kubeadm patches; Constellation needs none.)
//
// KubeletConfiguration has fields without omitempty, so its zero durations appear as "0s",
// as in kubeadm's own `kubeadm config print init-defaults`; the kubelet defaults them.
//
// # Decisions beyond kubeadm's defaults
//
// InitConfiguration:
//   - localAPIEndpoint advertises NodeIP on port 6443; controlPlaneEndpoint is the platform's
//     stable API endpoint (InitParams.ControlPlaneEndpoint: the local provider's load
//     balancer), and defaults to NodeIP:6443 where the platform has none (see "Weak points").
//   - nodeRegistration: name and criSocket always explicit (no hostname lookup, no CRI
//     detection); kubeletExtraArgs node-ip=NodeIP, so the node's InternalIP is the address the
//     platform attributes to it (and that its kubelet certificate carries); taints explicitly
//     the control-plane NoSchedule taint (kubeadm's default, written out so it is visible).
//   - skipPhases: bootstrap-token and show-join-command. No bootstrap token exists in a Constellation cluster: the
//     join service hands every node a short-lived client certificate for its own name
//     (internal/kube/kubeletcsr), and a node joins with it (Join: file discovery). The
//     phase would create a token (kubeadm's defaulting always adds one) and, worse, the
//     ClusterRoleBinding kubeadm:node-autoapprove-bootstrap, under which
//     kube-controller-manager approves a bootstrap token's kubelet client request for any
//     node name: with any token, one node could become another, a control plane included.
//     Skipping the phase also skips its cluster-info ConfigMap (joins do not read it: the
//     node takes the CA from its attested ticket) and the rule that lets kubelets renew their
//     own certificates (kubeadm:node-autoapprove-certificate-rotation), which
//     internal/deploy creates instead, nothing else. show-join-command goes with it (kubeadm
//     refuses to run it without the token it prints). bootstrapTokens is left empty;
//     kubeadm's defaulting invents a token value nobody ever sees or creates.
//     kube-proxy stays: the local provider's CNI (bridge + host-local) has no service
//     implementation of its own, so Services need kube-proxy.
//
// ClusterConfiguration:
//   - encryptionAlgorithm ECDSA-P256: the certificates kubeadm creates match the ECDSA P-256
//     CAs of internal/pki (kubeadm's default is RSA-2048).
//   - apiServer.extraArgs authorization-config: the removed-node authorizer first, then Node
//     and RBAC as kubeadm would (internal/nodeauthz; kubeadm drops its authorization-mode
//     when this is set), with its directory mounted read-only (extraVolumes). The bootstrapper
//     writes the files there before kubeadm runs on a control plane.
//   - apiServer.extraArgs profiling=false (no /debug/pprof on the API server). With
//     KubeletServingCert also kubelet-certificate-authority=<certificatesDir>/ca.crt: the API
//     server then verifies kubelet serving certificates (for logs, exec, port-forward), which
//     kubeadm leaves unverified because kubelets sign their own by default.
//   - controllerManager and scheduler extraArgs profiling=false and bind-address=127.0.0.1
//     (kubeadm's default address, written out so that it is checked: their metrics and health
//     endpoints stay off the node network). controllerManager also cluster-signing-duration
//     kubeletcsr.ClientValidity: the certificates a kubelet renews its client certificate to
//     live as short as the ones Constellation issues (kubeadm's default is a year).
//     It also talks to the API server at up to 100 requests/s (burst 200) instead of 20 (30):
//     at start it sets up its ~40 controllers one after the other, and the client's rate limit
//     spread that over 4 s, so the DaemonSets of init (the join, key and verification
//     services) got their pods 4 s late (controllerManagerQPS).
//   - etcd local, dataDir /var/lib/etcd (kubeadm's default, explicit because it must be on
//     the encrypted state storage); certificatesDir /etc/kubernetes/pki (explicit, because the
//     bootstrapper writes the cluster CAs there beforehand and kubelet-certificate-authority
//     names a file in it).
//   - networking: serviceSubnet required, podSubnet optional (with it, kubeadm lets the
//     controller manager allocate node pod CIDRs); dnsDomain kubeadm's default.
//   - apiServer.certSANs: the extra names only; kubeadm adds the advertise address, the
//     control-plane endpoint's host and the in-cluster names itself.
//   - no audit policy, no encryption-at-rest configuration: etcd's data lives on the node's
//     encrypted state storage.
//
// KubeletConfiguration (all explicit, most equal to what kubeadm would set):
//   - authentication: anonymous disabled, webhook enabled, x509 client CA <certificatesDir>/ca.crt;
//     authorization mode Webhook; readOnlyPort 0; rotateCertificates true (the client
//     certificate, short-lived, is renewed by the kubelet through kube-controller-manager);
//     serverTLSBootstrap false: kubeadm approves no kubelet-serving CSRs, so with it kubelets
//     would have no serving certificate at all.
//   - KubeletServingCert: tlsCertFile /var/lib/kubelet/pki/kubelet.crt and tlsPrivateKeyFile
//     /var/lib/kubelet/pki/kubelet.key (KubeletCertFile, KubeletKeyFile), which the
//     bootstrapper must write on every node (the first one included) before kubeadm starts the
//     kubelet, which does not start without them: the certificate signed by the cluster CA for
//     the node's name and IPs, NodeIP among them, because the API server dials the node's
//     InternalIP first (internal/kube/kubeletcsr issues such certificates). Without
//     KubeletServingCert, each kubelet signs its own serving certificate.
//   - protectKernelDefaults is not set: it makes the kubelet refuse to start unless the kernel
//     has the sysctls it would set, which a local sandbox (shared host kernel) cannot promise.
//
// Sandbox (the local provider's nodes, see platform facts: kubeadm init in a network and
// mount namespace) switches on exactly what that needs, and nothing else:
// nodeRegistration.ignorePreflightErrors [all] (swap, cgroups v1, kernel modules and
// hostname checks of a shared host kernel), imagePullPolicy Never (control-plane images are
// imported into containerd, there is no registry), KubeletConfiguration cgroupDriver cgroupfs
// (no systemd in the sandbox; kubeadm's default is systemd), failSwapOn false and failCgroupV1
// false (the host's cgroups may be v1, which the kubelet of v1.35 refuses by default).
//
// # Weak points
//
//   - Without ControlPlaneEndpoint the endpoint is the first node's address, a single point of
//     failure: other control-plane nodes can join, but every kubeconfig points at the first
//     node. The local provider sets it to its load balancer; every platform should.
//   - Sandbox ignores every preflight error, real problems included; they surface later.
//   - Single-stack only: ServiceCIDR and PodCIDR are one prefix each, in NodeIP's family.
package kubeadmconfig

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path"
	"regexp"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	serializerjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/util/validation"
	kubeproxyv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	kubeadmv1beta4 "k8s.io/kubernetes/cmd/kubeadm/app/apis/kubeadm/v1beta4"
	kubeadmconstants "k8s.io/kubernetes/cmd/kubeadm/app/constants"
	"k8s.io/utils/ptr"

	"github.com/openconstellation/constellation/internal/kube/kubeletcsr"
	"github.com/openconstellation/constellation/internal/nodeauthz"
)

// APIServerPort is the port every control-plane node's API server listens on and advertises.
const APIServerPort = 6443

// Paths on the node.
const (
	// CertificatesDir holds the cluster PKI in kubeadm's layout (kubeadm's default).
	CertificatesDir = kubeadmv1beta4.DefaultCertificatesDir
	// EtcdDataDir is the local etcd member's data (kubeadm's default).
	EtcdDataDir = kubeadmv1beta4.DefaultEtcdDataDir
	// KubeletCertFile and KubeletKeyFile are the kubelet's serving certificate and key when
	// InitParams.KubeletServingCert is set.
	KubeletCertFile = "/var/lib/kubelet/pki/" + KubeletPKIName + ".crt"
	KubeletKeyFile  = "/var/lib/kubelet/pki/" + KubeletPKIName + ".key"
	// KubeletPKIName is the base name of the kubelet serving certificate and key.
	KubeletPKIName = "kubelet"
)

// SkippedInitPhases are the phases of `kubeadm init` Constellation skips (see the package
// documentation).
var SkippedInitPhases = []string{"bootstrap-token", "show-join-command"}

// InitParams configure `kubeadm init` on the first control-plane node.
type InitParams struct {
	// NodeName is the Kubernetes node name (required, a DNS-1123 subdomain).
	NodeName string
	// NodeIP is the node's address: the API server's advertise address and the kubelet's
	// node IP (required, global unicast: not loopback, link-local, multicast or unspecified;
	// private ranges are fine).
	NodeIP netip.Addr
	// ClusterName names the cluster in kubeconfigs (optional, kubeadm's default "kubernetes").
	ClusterName string
	// KubernetesVersion is the control plane's version, "v1.<minor>.<patch>" (required).
	KubernetesVersion string
	// ControlPlaneEndpoint is the stable host:port of the API servers (optional, default
	// NodeIP:APIServerPort).
	ControlPlaneEndpoint string
	// APIServerCertSANs are extra IPs and DNS names of the API server certificate (optional).
	APIServerCertSANs []string
	// ServiceCIDR is the Service IP range (required, same IP family as NodeIP, /12 to /28
	// for IPv4, /108 to /124 for IPv6).
	ServiceCIDR netip.Prefix
	// PodCIDR is the pod IP range split into per-node /24 (IPv4) or /64 (IPv6) ranges
	// (optional; same family as NodeIP, disjoint from ServiceCIDR).
	PodCIDR netip.Prefix
	// CRISocket is the container runtime's endpoint, "unix:///<path>" (required).
	CRISocket string
	// ImageRepository is where the control-plane images come from (optional, kubeadm's
	// default registry.k8s.io).
	ImageRepository string
	// Sandbox configures a local-provider node (see the package documentation).
	Sandbox bool
	// ComponentWait as in NodeSettings.
	ComponentWait time.Duration
	// KubeletServingCert makes every kubelet serve KubeletCertFile/KubeletKeyFile (signed by
	// the cluster CA) and the API server verify them (see the package documentation).
	KubeletServingCert bool
}

// JoinParams configure `kubeadm join` on every other node.
type JoinParams struct {
	// NodeName, NodeIP and CRISocket as in InitParams.
	NodeName  string
	NodeIP    netip.Addr
	CRISocket string
	// DiscoveryFile is the kubeconfig kubeadm discovers the cluster with and authenticates
	// the node's TLS bootstrap with (an absolute path, required): the API server endpoint,
	// the cluster CA and the node's client certificate from its join ticket (Kubeconfig).
	DiscoveryFile string
	// ControlPlane joins the node as a control-plane node advertising NodeIP:APIServerPort.
	// The bootstrapper has written the shared CA keys (pki.ControlPlaneFiles) beforehand, so
	// no certificate key is needed.
	ControlPlane bool
	// Sandbox configures a local-provider node (see the package documentation).
	Sandbox bool
	// ComponentWait as in NodeSettings.
	ComponentWait time.Duration
}

// Init returns the configuration file for `kubeadm init`: InitConfiguration,
// ClusterConfiguration and KubeletConfiguration, and kube-proxy's, one after the other:
//
//  1. the node: its registration and the API server's local endpoint;
//  2. the cluster: etcd, networks, the control-plane components' hardened flags;
//  3. the kubelet: webhook authentication and authorization, its serving certificate;
//  4. kube-proxy in nftables mode.
func Init(p InitParams) ([]byte, error) {
	if err := p.validate(); err != nil {
		return nil, fmt.Errorf("invalid kubeadm init parameters: %w", err)
	}
	nodeIP := p.NodeIP.Unmap()
	initCfg := &kubeadmv1beta4.InitConfiguration{
		NodeRegistration: nodeRegistration(p.NodeName, nodeIP, p.CRISocket, p.Sandbox, true),
		LocalAPIEndpoint: kubeadmv1beta4.APIEndpoint{AdvertiseAddress: nodeIP.String(), BindPort: APIServerPort},
		SkipPhases:       SkippedInitPhases,
		Timeouts:         timeouts(p.ComponentWait),
	}
	return encode(initCfg, clusterConfiguration(p, nodeIP), initKubeletConfiguration(p), kubeProxyConfiguration(p))
}

// clusterConfiguration is the cluster's kubeadm configuration: etcd's data directory, the
// networks, the control-plane endpoint (this node's unless p names one), and the API
// server, controller manager and scheduler with their hardened flags.
func clusterConfiguration(p InitParams, nodeIP netip.Addr) *kubeadmv1beta4.ClusterConfiguration {
	endpoint := p.ControlPlaneEndpoint
	if endpoint == "" {
		endpoint = netip.AddrPortFrom(nodeIP, APIServerPort).String()
	}
	apiServerArgs := []kubeadmv1beta4.Arg{
		{Name: "profiling", Value: "false"},
		{Name: "authorization-config", Value: nodeauthz.AuthorizationConfigFile},
	}
	if p.KubeletServingCert {
		apiServerArgs = append(apiServerArgs, kubeadmv1beta4.Arg{Name: "kubelet-certificate-authority", Value: path.Join(CertificatesDir, kubeadmconstants.CACertName)})
	}
	localComponentArgs := func() []kubeadmv1beta4.Arg {
		return []kubeadmv1beta4.Arg{{Name: "profiling", Value: "false"}, {Name: "bind-address", Value: "127.0.0.1"}}
	}
	clusterCfg := &kubeadmv1beta4.ClusterConfiguration{
		Etcd: kubeadmv1beta4.Etcd{Local: &kubeadmv1beta4.LocalEtcd{DataDir: EtcdDataDir}},
		Networking: kubeadmv1beta4.Networking{
			ServiceSubnet: p.ServiceCIDR.String(),
		},
		KubernetesVersion:    p.KubernetesVersion,
		ControlPlaneEndpoint: endpoint,
		APIServer: kubeadmv1beta4.APIServer{
			ControlPlaneComponent: kubeadmv1beta4.ControlPlaneComponent{
				ExtraArgs: apiServerArgs,
				ExtraVolumes: []kubeadmv1beta4.HostPathMount{{
					Name: "constellation-authorization", HostPath: nodeauthz.ConfigDir, MountPath: nodeauthz.ConfigDir,
					ReadOnly: true, PathType: corev1.HostPathDirectory,
				}},
			},
			CertSANs: p.APIServerCertSANs,
		},
		ControllerManager: kubeadmv1beta4.ControlPlaneComponent{ExtraArgs: append(localComponentArgs(),
			kubeadmv1beta4.Arg{Name: "cluster-signing-duration", Value: kubeletcsr.ClientValidity.String()},
			kubeadmv1beta4.Arg{Name: "kube-api-qps", Value: controllerManagerQPS},
			kubeadmv1beta4.Arg{Name: "kube-api-burst", Value: controllerManagerBurst})},
		Scheduler:           kubeadmv1beta4.ControlPlaneComponent{ExtraArgs: localComponentArgs()},
		CertificatesDir:     CertificatesDir,
		ImageRepository:     p.ImageRepository,
		ClusterName:         p.ClusterName,
		EncryptionAlgorithm: kubeadmv1beta4.EncryptionAlgorithmECDSAP256,
	}
	if p.PodCIDR.IsValid() {
		clusterCfg.Networking.PodSubnet = p.PodCIDR.String()
	}
	return clusterCfg
}

// initKubeletConfiguration is the kubelet configuration kubeadm init uploads for every node.
func initKubeletConfiguration(p InitParams) *kubeletv1beta1.KubeletConfiguration {
	kubeletCfg := &kubeletv1beta1.KubeletConfiguration{
		Authentication: kubeletv1beta1.KubeletAuthentication{
			X509:      kubeletv1beta1.KubeletX509Authentication{ClientCAFile: path.Join(CertificatesDir, kubeadmconstants.CACertName)},
			Webhook:   kubeletv1beta1.KubeletWebhookAuthentication{Enabled: ptr.To(true)},
			Anonymous: kubeletv1beta1.KubeletAnonymousAuthentication{Enabled: ptr.To(false)},
		},
		Authorization:      kubeletv1beta1.KubeletAuthorization{Mode: kubeletv1beta1.KubeletAuthorizationModeWebhook},
		ReadOnlyPort:       0,
		RotateCertificates: true,
		ServerTLSBootstrap: false,
	}
	if p.KubeletServingCert {
		kubeletCfg.TLSCertFile = KubeletCertFile
		kubeletCfg.TLSPrivateKeyFile = KubeletKeyFile
	}
	if p.Sandbox {
		kubeletCfg.CgroupDriver = "cgroupfs"
		kubeletCfg.FailSwapOn = ptr.To(false)
		// The sandbox's cgroups are the host's, cgroup v1 on our machines: the kubelet of
		// v1.35 refuses to start there unless told not to (its default turned to true).
		kubeletCfg.FailCgroupV1 = ptr.To(false)
	}
	return kubeletCfg
}

// kubeProxyConfiguration runs kube-proxy in nftables mode (the sandbox's kube-proxy image
// carries nft; nftables is kube-proxy's current mode). A sandbox node shares the host's
// conntrack table, whose size only the host may set: maxPerCore 0 leaves it alone.
func kubeProxyConfiguration(p InitParams) *kubeproxyv1alpha1.KubeProxyConfiguration {
	proxyCfg := &kubeproxyv1alpha1.KubeProxyConfiguration{Mode: "nftables"}
	if p.Sandbox {
		proxyCfg.Conntrack.MaxPerCore = ptr.To[int32](0)
		proxyCfg.Conntrack.Min = ptr.To[int32](0)
	}
	return proxyCfg
}

// Join returns the configuration file for `kubeadm join`: a JoinConfiguration. The kubelet's
// configuration comes from the cluster (see the package documentation).
func Join(p JoinParams) ([]byte, error) {
	if err := p.validate(); err != nil {
		return nil, fmt.Errorf("invalid kubeadm join parameters: %w", err)
	}
	nodeIP := p.NodeIP.Unmap()
	joinCfg := &kubeadmv1beta4.JoinConfiguration{
		NodeRegistration: nodeRegistration(p.NodeName, nodeIP, p.CRISocket, p.Sandbox, p.ControlPlane),
		// File discovery with the node's own credentials: kubeadm trusts the CA in the file
		// (from the attested ticket) and the kubelet's TLS bootstrap authenticates as
		// system:node:<name> with the ticket's client certificate, so its request for a
		// certificate of its own is the only one kube-controller-manager approves.
		Discovery: kubeadmv1beta4.Discovery{File: &kubeadmv1beta4.FileDiscovery{KubeConfigPath: p.DiscoveryFile}},
		Timeouts:  timeouts(p.ComponentWait),
	}
	if p.ControlPlane {
		joinCfg.ControlPlane = &kubeadmv1beta4.JoinControlPlane{
			LocalAPIEndpoint: kubeadmv1beta4.APIEndpoint{AdvertiseAddress: nodeIP.String(), BindPort: APIServerPort},
		}
	}
	return encode(joinCfg)
}

// UpgradeParams configure `kubeadm upgrade` on a control-plane node: `kubeadm upgrade apply`
// moves the control plane to KubernetesVersion, `kubeadm upgrade node phase addon all` moves
// kube-proxy and CoreDNS to the cluster's version.
type UpgradeParams struct {
	// KubernetesVersion is the version the control plane moves to, "v1.<minor>.<patch>"
	// (required).
	KubernetesVersion string
	// Sandbox configures a local-provider node (see the package documentation).
	Sandbox bool
}

// SkippedUpgradePhases are the phases of `kubeadm upgrade apply` Constellation skips: the
// bootstrap-token phase would create the RBAC rules init skips (see the package documentation),
// kubeadm:node-autoapprove-bootstrap among them.
var SkippedUpgradePhases = []string{"bootstrap-token"}

// Upgrade returns the configuration file for `kubeadm upgrade apply` and `kubeadm upgrade
// node`: an UpgradeConfiguration. Decisions beyond kubeadm's defaults:
//   - apply.skipPhases SkippedUpgradePhases.
//   - certificateRenewal false: the node running it has just joined with fresh certificates,
//     and the other control planes are replaced, not upgraded in place; renewing would only
//     restart components once more.
//   - etcdUpgrade false: each control plane's etcd is the one its own kubeadm deployed when it
//     joined (the new image's kubeadm picks its etcd for the cluster's version already), and
//     upgrading it in place restarts it: while a roll replaces the only control plane, etcd
//     has two members, and a restart of either loses quorum (e2e TestUpgrade saw both API
//     servers unready for 40 s).
//   - Sandbox: ignorePreflightErrors [all] (kubeadm looks for the kubelet on PATH and refuses
//     cgroup v1 hosts for v1.35 kubelets, whatever failCgroupV1 says) and imagePullPolicy Never
//     (there is no registry; the node has the images of both versions).
func Upgrade(p UpgradeParams) ([]byte, error) {
	if !versionPattern.MatchString(p.KubernetesVersion) {
		return nil, fmt.Errorf("invalid kubeadm upgrade parameters: KubernetesVersion %q: want v1.<minor>.<patch>", p.KubernetesVersion)
	}
	cfg := &kubeadmv1beta4.UpgradeConfiguration{
		Apply: kubeadmv1beta4.UpgradeApplyConfiguration{
			KubernetesVersion:  p.KubernetesVersion,
			SkipPhases:         SkippedUpgradePhases,
			CertificateRenewal: ptr.To(false),
			EtcdUpgrade:        ptr.To(false),
		},
		Node: kubeadmv1beta4.UpgradeNodeConfiguration{
			CertificateRenewal: ptr.To(false),
			EtcdUpgrade:        ptr.To(false),
		},
	}
	if p.Sandbox {
		cfg.Apply.IgnorePreflightErrors, cfg.Node.IgnorePreflightErrors = []string{"all"}, []string{"all"}
		cfg.Apply.ImagePullPolicy, cfg.Node.ImagePullPolicy = corev1.PullNever, corev1.PullNever
	}
	return encode(cfg)
}

func nodeRegistration(name string, nodeIP netip.Addr, criSocket string, sandbox, controlPlane bool) kubeadmv1beta4.NodeRegistrationOptions {
	nr := kubeadmv1beta4.NodeRegistrationOptions{
		Name:             name,
		CRISocket:        criSocket,
		KubeletExtraArgs: []kubeadmv1beta4.Arg{{Name: "node-ip", Value: nodeIP.String()}},
		// Explicit either way: kubeadm's default for a nil list depends on the node's role.
		Taints: []corev1.Taint{},
	}
	if controlPlane {
		nr.Taints = []corev1.Taint{kubeadmconstants.ControlPlaneTaint}
	}
	if sandbox {
		nr.IgnorePreflightErrors = []string{"all"}
		nr.ImagePullPolicy = corev1.PullNever
	}
	return nr
}

// scheme knows the versioned types this package writes.
var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{kubeadmv1beta4.AddToScheme, kubeletv1beta1.AddToScheme, kubeproxyv1alpha1.AddToScheme} {
		if err := add(s); err != nil {
			panic(fmt.Sprintf("registering kubeadm configuration types: %v", err))
		}
	}
	return s
}()

// encode writes objs as one multi-document YAML file, each with its apiVersion and kind.
func encode(objs ...runtime.Object) ([]byte, error) {
	yamlSerializer := serializerjson.NewSerializerWithOptions(serializerjson.DefaultMetaFactory, scheme, scheme, serializerjson.SerializerOptions{Yaml: true})
	codecs := serializer.NewCodecFactory(scheme)
	var out bytes.Buffer
	for i, obj := range objs {
		gvks, _, err := scheme.ObjectKinds(obj)
		if err != nil {
			return nil, fmt.Errorf("encoding kubeadm configuration: %w", err)
		}
		if i > 0 {
			out.WriteString("---\n")
		}
		if err := codecs.EncoderForVersion(yamlSerializer, gvks[0].GroupVersion()).Encode(obj, &out); err != nil {
			return nil, fmt.Errorf("encoding %s: %w", gvks[0].Kind, err)
		}
	}
	return out.Bytes(), nil
}

// Validation.

var (
	versionPattern = regexp.MustCompile(`^v1\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$`)
)

func (p InitParams) validate() error {
	var errs []error
	errs = append(errs, validateNode(p.NodeName, p.NodeIP, p.CRISocket)...)
	if p.ClusterName != "" {
		for _, msg := range validation.IsDNS1123Subdomain(p.ClusterName) {
			errs = append(errs, fmt.Errorf("ClusterName %q: %s", p.ClusterName, msg))
		}
	}
	if !versionPattern.MatchString(p.KubernetesVersion) {
		errs = append(errs, fmt.Errorf("KubernetesVersion %q: want v1.<minor>.<patch>", p.KubernetesVersion))
	}
	if p.ControlPlaneEndpoint != "" {
		if err := validateHostPort(p.ControlPlaneEndpoint); err != nil {
			errs = append(errs, fmt.Errorf("ControlPlaneEndpoint: %w", err))
		}
	}
	for _, san := range p.APIServerCertSANs {
		if _, err := netip.ParseAddr(san); err == nil {
			continue
		}
		if len(validation.IsDNS1123Subdomain(san)) > 0 && len(validation.IsWildcardDNS1123Subdomain(san)) > 0 {
			errs = append(errs, fmt.Errorf("APIServerCertSANs: %q is neither an IP address nor a DNS name", san))
		}
	}

	// Networks: single stack, in the node's IP family.
	if err := validatePrefix(p.ServiceCIDR, p.NodeIP, true); err != nil {
		errs = append(errs, fmt.Errorf("ServiceCIDR: %w", err))
	} else if host := p.ServiceCIDR.Addr().BitLen() - p.ServiceCIDR.Bits(); host > kubeadmconstants.MaximumBitsForServiceSubnet || host < 4 {
		errs = append(errs, fmt.Errorf("ServiceCIDR %s: %d host bits, want 4 to %d", p.ServiceCIDR, host, kubeadmconstants.MaximumBitsForServiceSubnet))
	}
	if p.PodCIDR != (netip.Prefix{}) {
		if err := validatePrefix(p.PodCIDR, p.NodeIP, false); err != nil {
			errs = append(errs, fmt.Errorf("PodCIDR: %w", err))
		} else {
			// The controller manager gives every node a /24 (IPv4) or /64 (IPv6) and allows
			// at most 2^16 node ranges.
			nodeBits := 24
			if p.PodCIDR.Addr().Is6() {
				nodeBits = 64
			}
			if bits := p.PodCIDR.Bits(); bits > nodeBits || nodeBits-bits > kubeadmconstants.PodSubnetNodeMaskMaxDiff {
				errs = append(errs, fmt.Errorf("PodCIDR %s: prefix length must be %d to %d (per-node ranges are /%d)", p.PodCIDR, nodeBits-kubeadmconstants.PodSubnetNodeMaskMaxDiff, nodeBits, nodeBits))
			}
			if p.ServiceCIDR.IsValid() && p.PodCIDR.Overlaps(p.ServiceCIDR) {
				errs = append(errs, fmt.Errorf("PodCIDR %s overlaps ServiceCIDR %s", p.PodCIDR, p.ServiceCIDR))
			}
		}
	}
	return errors.Join(errs...)
}

func (p JoinParams) validate() error {
	var errs []error
	errs = append(errs, validateNode(p.NodeName, p.NodeIP, p.CRISocket)...)
	if !path.IsAbs(p.DiscoveryFile) || path.Clean(p.DiscoveryFile) != p.DiscoveryFile {
		errs = append(errs, fmt.Errorf("DiscoveryFile %q: want a clean absolute path", p.DiscoveryFile))
	}
	return errors.Join(errs...)
}

func validateNode(name string, ip netip.Addr, criSocket string) []error {
	var errs []error
	if name == "" {
		errs = append(errs, errors.New("NodeName: required"))
	} else {
		for _, msg := range validation.IsDNS1123Subdomain(name) {
			errs = append(errs, fmt.Errorf("NodeName %q: %s", name, msg))
		}
	}
	switch {
	case !ip.IsValid():
		errs = append(errs, errors.New("NodeIP: required"))
	case ip.Zone() != "":
		errs = append(errs, fmt.Errorf("NodeIP %s: has a zone", ip))
	case !ip.IsGlobalUnicast():
		// As kubeadm requires of an advertise address; private ranges are fine.
		errs = append(errs, fmt.Errorf("NodeIP %s: not a global unicast address", ip))
	}
	if sock, ok := strings.CutPrefix(criSocket, "unix://"); !ok || !path.IsAbs(sock) || path.Clean(sock) != sock {
		errs = append(errs, fmt.Errorf("CRISocket %q: want unix://<absolute path>", criSocket))
	}
	return errs
}

// validatePrefix checks that p is a valid, masked prefix of nodeIP's family; required tells
// whether a missing p is an error.
func validatePrefix(p netip.Prefix, nodeIP netip.Addr, required bool) error {
	if p == (netip.Prefix{}) && required {
		return errors.New("required")
	}
	if !p.IsValid() {
		return fmt.Errorf("invalid prefix %s", p)
	}
	if p.Masked() != p {
		return fmt.Errorf("%s has host bits set (network is %s)", p, p.Masked())
	}
	if p.Addr().Is4In6() {
		return fmt.Errorf("%s is an IPv4-mapped IPv6 prefix", p)
	}
	if nodeIP.IsValid() && p.Addr().Is4() != nodeIP.Unmap().Is4() {
		return fmt.Errorf("%s is not in NodeIP's IP family", p)
	}
	return nil
}

// validateHostPort checks a "host:port" with a non-empty host and a port from 1 to 65535.
func validateHostPort(hostport string) error {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return fmt.Errorf("want host:port: %w", err)
	}
	if host == "" {
		return fmt.Errorf("%q has no host", hostport)
	}
	if _, err := netip.ParseAddr(host); err != nil && len(validation.IsDNS1123Subdomain(host)) > 0 {
		return fmt.Errorf("host %q is neither an IP address nor a DNS name", host)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port %q is not a number from 1 to 65535", port)
	}
	return nil
}

// NodeSettings are what a node platform's OS fixes for kubeadm (boot.OS.NodeSettings), the
// same on every node of the platform: the container runtime's socket, where control-plane
// images come from, and whether the node is a local sandbox. The bootstrapper combines them
// with the init request or join ticket, and the Kubernetes version keeper with an upgrade.
type NodeSettings struct {
	CRISocket       string
	ImageRepository string
	// Sandbox is set by the local provider's node platform only (see the package
	// documentation); a VM or cloud node runs kubeadm's preflight checks and pull policy.
	Sandbox bool
	// ComponentWait, if set, is how long kubeadm waits for the kubelet and the control-plane
	// components to become healthy (timeouts.kubeletHealthCheck and
	// controlPlaneComponentHealthCheck; kubeadm's default is 4 minutes each): a machine
	// under emulation starts them several times slower.
	ComponentWait time.Duration
}

// timeouts is kubeadm's timeouts block for wait (nil: kubeadm's defaults).
func timeouts(wait time.Duration) *kubeadmv1beta4.Timeouts {
	if wait <= 0 {
		return nil
	}
	d := &metav1.Duration{Duration: wait}
	return &kubeadmv1beta4.Timeouts{ControlPlaneComponentHealthCheck: d, KubeletHealthCheck: d}
}

// controllerManagerQPS and controllerManagerBurst are the controller manager's client rate
// limits (kube-api-qps, kube-api-burst; defaults 20 and 30). A cluster of this size stays far
// below them in steady state; they matter at start, when the controllers set up.
const (
	controllerManagerQPS   = "100"
	controllerManagerBurst = "200"
)
