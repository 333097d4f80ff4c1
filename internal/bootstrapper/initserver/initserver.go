// Package initserver is the node side of `constellation apply`'s init call: the server a
// fresh control-plane node runs until it is initialized or has joined a cluster.
//
// Init is served over the attested channel with the node attesting (the CLI verifies the
// node before it sends the master secret). Every attested handshake costs the node a TPM
// quote for an anonymous caller, so handshakes are admitted by a handshakelimit.Limiter
// (DefaultHandshakeLimits: a small rate per caller address, few at once) before the node
// quotes. The caller is authenticated by the init secret, checked against the bcrypt hash the
// platform's metadata holds, before anything else is looked at or said: a caller without the
// secret gets the same answer whatever the node's state. Init attempts are limited per caller
// address too (DefaultAttemptLimits), before the hash is read: one connection carries any
// number of calls, and each costs a bcrypt comparison and is a guess. Then, in this order:
//
//  1. check the request (every problem named at once); nothing has changed yet;
//  2. derive the measurement secret, cluster ID and state-disk key (docs/design.md "2. Keys");
//  3. take the node lock, extending PCR 15 with the cluster ID: the point of no return;
//  4. re-key, mark and unlock the state storage;
//  5. generate the kubeadm configuration and run `kubeadm init`;
//  6. record the cluster in Kubernetes: Secret kube-system/constellation-mastersecret
//     (for the key service) and ConfigMap kube-system/constellation-cluster (cluster ID,
//     measurement salt, version, components: for the join service and verifiers), and this
//     node as the owner of its state disk (internal/diskowner: the join service releases a
//     disk's key only to its recorded owner);
//  7. deploy the in-cluster services (Config.Deploy: internal/deploy);
//  8. return the admin kubeconfig and the cluster ID.
//
// Progress is streamed throughout. A failure before step 3 (wrong secret, invalid request,
// node not a control-plane node, lock already taken by a join or an earlier init) changes
// nothing and returns only the error: an unauthenticated caller learns nothing about the
// node, because the secret is checked first. A failure after step 3 streams the log of this init (its steps and kubeadm's output)
// and then the error; the node is then marked for a cluster that did not come up and must
// be recreated.
//
// From step 3 on the work runs on a context detached from the call: a CLI that disconnects
// does not leave a half-run kubeadm behind (the node finishes, within InitTimeout).
package initserver

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/bcrypt"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/openconstellation/constellation/api/init/initpb"
	"github.com/openconstellation/constellation/internal/bootstrapper/node"
	"github.com/openconstellation/constellation/internal/bootstrapper/nodelock"
	"github.com/openconstellation/constellation/internal/clusterrecord"
	"github.com/openconstellation/constellation/internal/diskowner"
	"github.com/openconstellation/constellation/internal/fileutil"
	"github.com/openconstellation/constellation/internal/handshakelimit"
	"github.com/openconstellation/constellation/internal/kms"
	"github.com/openconstellation/constellation/internal/kube/kubeadmconfig"
	"github.com/openconstellation/constellation/internal/kube/kubeletcred"
	"github.com/openconstellation/constellation/internal/kube/kubeletcsr"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/nodeauthz"
	"github.com/openconstellation/constellation/internal/pki"
	"github.com/openconstellation/constellation/internal/registries"
	"github.com/openconstellation/constellation/pkg/atls"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// Names of what init records in the cluster (internal/clusterrecord).
const (
	RecordNamespace        = clusterrecord.Namespace
	MasterSecretSecretName = clusterrecord.MasterSecretName
	ClusterConfigMapName   = clusterrecord.ClusterConfigMapName
)

// DefaultInitTimeout bounds the work after the node lock is taken.
const DefaultInitTimeout = 15 * time.Minute

// DefaultAcceptLimits bound the connections whose attested handshake has not finished (step
// 0, before TLS: docs/atls.md): the CLI opens one at a time; the deadline is aTLS's.
var DefaultAcceptLimits = handshakelimit.AcceptLimits{PerPeer: 4, Total: 32, Timeout: atls.DefaultHandshakeTimeout}

// DefaultHandshakeLimits admit the attested handshakes of anonymous callers, each of which
// makes the node quote: the CLI needs one per init, and a retry now and then.
var DefaultHandshakeLimits = handshakelimit.Limits{
	Rate: rate.Every(5 * time.Second), Burst: 4, PerPeer: 2, Concurrent: 2, Waiting: 4,
	What: "attested handshakes",
}

// DefaultAttemptLimits admit Init calls before the init secret is checked (a bcrypt
// comparison and a guess each). A running init holds no attempt: the attempt ends with the
// secret check.
var DefaultAttemptLimits = handshakelimit.Limits{
	Rate: rate.Every(5 * time.Second), Burst: 4, PerPeer: 1, Concurrent: 2, Waiting: 4,
	What: "init attempts",
}

// logChunkSize is the size of InitLog messages.
const logChunkSize = 64 << 10

// maxLogSize bounds the log kept of one init (its tail is kept).
const maxLogSize = 4 << 20

// KubeadmConfigFunc builds the `kubeadm init` configuration for this node.
type KubeadmConfigFunc func(InitParams) ([]byte, error)

// InitParams is what the kubeadm configuration of an init depends on.
type InitParams struct {
	Self              metadata.Instance
	ClusterName       string
	KubernetesVersion string
	APIServerCertSANs []string
	ServiceCIDR       netip.Prefix // invalid: kubeadm's default
	PodCIDR           netip.Prefix // invalid: none
	// ControlPlaneEndpoint is the cluster's stable API endpoint (host:port): kubeadm puts its
	// host into the API server certificate and every kubeconfig it writes names it.
	ControlPlaneEndpoint string
}

// DefaultServiceCIDR is the service network when the request names none (kubeadm's).
var DefaultServiceCIDR = netip.MustParsePrefix("10.96.0.0/12")

// KubeadmConfig returns the KubeadmConfigFunc of a node image with settings s: kubeadm's
// v1beta4 configuration (internal/kube/kubeadmconfig), with kubelet serving certificates
// signed by the cluster CA (the init server writes the first node's).
func KubeadmConfig(s kubeadmconfig.NodeSettings) KubeadmConfigFunc {
	return func(p InitParams) ([]byte, error) {
		service := p.ServiceCIDR
		if !service.IsValid() {
			service = DefaultServiceCIDR
		}
		var nodeIP netip.Addr
		if len(p.Self.IPs) > 0 {
			nodeIP = p.Self.IPs[0]
		}
		return kubeadmconfig.Init(kubeadmconfig.InitParams{
			NodeName: p.Self.Name, NodeIP: nodeIP, ClusterName: p.ClusterName,
			KubernetesVersion: p.KubernetesVersion, APIServerCertSANs: p.APIServerCertSANs,
			ServiceCIDR: service, PodCIDR: p.PodCIDR, ControlPlaneEndpoint: p.ControlPlaneEndpoint,
			CRISocket: s.CRISocket, ImageRepository: s.ImageRepository, Sandbox: s.Sandbox, ComponentWait: s.ComponentWait,
			KubeletServingCert: true,
		})
	}
}

// DeployFunc deploys the in-cluster services after `kubeadm init`.
type DeployFunc func(ctx context.Context, d Deployment) error

// Deployment is what the init server hands to its DeployFunc.
type Deployment struct {
	// Kubeconfig is the admin kubeconfig kubeadm wrote.
	Kubeconfig []byte
	// Cluster is what init recorded in ConfigMap constellation-cluster.
	Cluster ClusterRecord
	// Attestation is what the join service admits nodes by, from the init request (set
	// whenever Config.Deploy is).
	Attestation choose.Reference
	// RegistryMirrors are the cluster's registry mirrors, from the init request.
	RegistryMirrors registries.Mirrors
	// APIEndpoint is the cluster's stable API endpoint (kubeadm's controlPlaneEndpoint): the
	// API server the join service names in its tickets.
	APIEndpoint string
	// Progress streams one line to the CLI (and into the init's log).
	Progress func(msg string)
}

// Config configures the init server.
type Config struct {
	// Node is the node's lock and state storage, opened fresh.
	Node *node.Node
	// Metadata says who this node is and holds the init-secret hash.
	Metadata metadata.Provider
	// Issuer attests the node to the CLI.
	Issuer attestation.Issuer
	// Kubeadm runs `kubeadm init`; KubeadmConfig builds its configuration.
	Kubeadm       node.Kubeadm
	KubeadmConfig KubeadmConfigFunc
	// KubernetesVersion, when set, is the only version this node's image runs.
	KubernetesVersion string
	// AdminKubeconfig is where kubeadm writes the admin kubeconfig
	// (/etc/kubernetes/admin.conf).
	AdminKubeconfig string
	// KubeletKubeconfig is the kubelet's kubeconfig (kubeletcred.KubeconfigFile): the init
	// server writes it with the node's short-lived client certificate before kubeadm runs,
	// and kubeadm keeps it, so the first kubelet's credential lives as short as every
	// other's (kubeadm's own would live a year).
	KubeletKubeconfig string
	// APIServerConfigDir is where the API server reads the removed-node authorizer's
	// configuration (nodeauthz.ConfigDir): written before kubeadm runs.
	APIServerConfigDir string
	// RegistryHostsDir is where the node's containerd reads its registry hosts
	// (registries.HostsDir): the request's registry mirrors are written there after the
	// commit. Empty: the node's registries are not configured.
	RegistryHostsDir string
	// PKIDir is kubeadm's certificates directory (/etc/kubernetes/pki): the init server
	// creates the cluster CAs there before kubeadm runs (kubeadm uses existing CAs), so it
	// can sign the first kubelet's serving certificate, which it writes to KubeletPKIDir
	// (/var/lib/kubelet/pki), as the join client does on every other node.
	PKIDir, KubeletPKIDir string
	// NodeLogs, when set, adds the node's other logs (kubelet, containerd) to the log
	// streamed on failure.
	NodeLogs func(ctx context.Context) []byte
	// Deploy, when set, deploys the in-cluster services (join, key and verification
	// service) once the cluster is recorded; internal/deploy.Run does. Its error fails the
	// init. Nil skips the step.
	Deploy DeployFunc
	// InitTimeout bounds the work after the lock is taken (DefaultInitTimeout).
	InitTimeout time.Duration
	// AcceptLimits bound connections whose attested handshake has not finished, from the
	// moment they are accepted; their Timeout is the handshake deadline. Unset limits: those
	// of DefaultAcceptLimits.
	AcceptLimits handshakelimit.AcceptLimits
	// HandshakeLimits admit attested handshakes before the node quotes; AttemptLimits admit
	// Init calls before the init secret is checked. Unset limits: those of
	// DefaultHandshakeLimits, DefaultAttemptLimits.
	HandshakeLimits, AttemptLimits handshakelimit.Limits
	// Now is the limiters' clock (time.Now when nil).
	Now func() time.Time
	// Log receives the server's structured log.
	Log *slog.Logger
}

// Server is the init server.
type Server struct {
	initpb.UnimplementedInitServiceServer
	cfg      Config
	serving  *handshakelimit.AttestingServer
	attempts *handshakelimit.Limiter

	running  sync.Mutex // one Init at a time
	finished chan struct{}
	err      error // of the init that took the node lock, once finished is closed
}

// New checks cfg and returns a server.
func New(cfg Config) (*Server, error) {
	var missing []string
	for name, v := range map[string]bool{
		"Node": cfg.Node == nil, "Metadata": cfg.Metadata == nil, "Issuer": cfg.Issuer == nil,
		"Kubeadm": cfg.Kubeadm == nil, "KubeadmConfig": cfg.KubeadmConfig == nil, "AdminKubeconfig": cfg.AdminKubeconfig == "",
		"KubeletKubeconfig": cfg.KubeletKubeconfig == "", "APIServerConfigDir": cfg.APIServerConfigDir == "", "PKIDir": cfg.PKIDir == "", "KubeletPKIDir": cfg.KubeletPKIDir == "",
	} {
		if v {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return nil, fmt.Errorf("init server: missing %s", strings.Join(missing, ", "))
	}
	if cfg.InitTimeout <= 0 {
		cfg.InitTimeout = DefaultInitTimeout
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	limits := handshakelimit.AttestingLimits{
		Accept:     cfg.AcceptLimits.Or(DefaultAcceptLimits),
		Handshakes: cfg.HandshakeLimits.Or(DefaultHandshakeLimits),
		Attempts:   cfg.AttemptLimits.Or(DefaultAttemptLimits),
	}
	log := cfg.Log
	serving, err := handshakelimit.NewAttestingServer(cfg.Issuer, limits, cfg.Now, func(remote netip.Addr, outcome string) {
		// Debug, not Warn: a flood would flood the log.
		log.Debug("connection refused before its handshake", "peer", remote.String(), "outcome", outcome)
	})
	if err != nil {
		return nil, fmt.Errorf("init server: %w", err)
	}
	return &Server{cfg: cfg, serving: serving, attempts: serving.Attempts(), finished: make(chan struct{})}, nil
}

// NewGRPCServer returns the gRPC server to serve s with: attested-channel credentials (the
// node attests), every connection bounded from the moment it is accepted (AcceptLimits), the
// service registered. opts are added (tests record calls).
func (s *Server) NewGRPCServer(opts ...grpc.ServerOption) *handshakelimit.GRPCServer {
	g := s.serving.NewGRPCServer(opts...)
	initpb.RegisterInitServiceServer(g, s)
	return g
}

// AcceptLimiter bounds the connections whose handshake has not finished.
func (s *Server) AcceptLimiter() *handshakelimit.AcceptLimiter { return s.serving.AcceptLimiter() }

// Finished is closed when an Init that took the node lock has ended; Err then tells how.
func (s *Server) Finished() <-chan struct{} { return s.finished }

// Err is the result of the Init that took the node lock (valid once Finished is closed).
func (s *Server) Err() error {
	<-s.finished
	return s.err
}

func (s *Server) finish(err error) {
	s.err = err
	close(s.finished)
}

// Init initializes the cluster on this node (see the package documentation).
func (s *Server) Init(req *initpb.InitRequest, stream initpb.InitService_InitServer) error {
	ctx := stream.Context()
	log := s.cfg.Log.With("method", "Init")
	// The secret first: whoever does not know it learns nothing about the node.
	if err := s.authenticate(ctx, log, req.GetInitSecret()); err != nil {
		return err
	}
	if s.cfg.Node.LockHolder() != "" {
		return s.refuse(log, codes.FailedPrecondition, "node-taken", "this node is already part of a cluster (node lock taken by %s): init changes nothing", s.cfg.Node.LockHolder())
	}
	r, err := parseRequest(req, s.cfg.KubernetesVersion)
	if err != nil {
		return s.refuse(log, codes.InvalidArgument, "invalid-request", "%v", err)
	}
	if s.cfg.Deploy != nil && r.attestation == nil {
		return s.refuse(log, codes.InvalidArgument, "invalid-request", "invalid init request: this node deploys the join service and needs the attestation configuration it admits nodes by (variant, reference sets, AK roots)")
	}
	self, err := s.cfg.Metadata.Self(ctx)
	if err != nil {
		return s.refuse(log, codes.Unavailable, "metadata", "reading this node's metadata: %v", err)
	}
	if err := self.Validate(); err != nil {
		return s.refuse(log, codes.FailedPrecondition, "metadata", "%v", err)
	}
	if self.Role != metadata.ControlPlane {
		return s.refuse(log, codes.FailedPrecondition, "not-control-plane", "node %s is a %s node: only control-plane nodes initialize clusters", self.Name, self.Role)
	}
	if r.endpoint, err = apiEndpoint(ctx, s.cfg.Metadata, self); err != nil {
		return s.refuse(log, codes.Unavailable, "metadata", "%v", err)
	}
	if !s.running.TryLock() {
		return s.refuse(log, codes.FailedPrecondition, "init-running", "an init is already running on this node")
	}
	defer s.running.Unlock()

	rec := newRecorder(stream, log)
	// Past the lock, the node finishes what it started even if the caller goes away.
	work, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.InitTimeout)
	defer cancel()
	kubeconfig, clusterID, err := s.initialize(work, r, self, rec)
	if errors.Is(err, nodelock.ErrLocked) || errors.Is(err, node.ErrNotFresh) {
		return s.refuse(log, codes.FailedPrecondition, "node-taken", "this node is already part of a cluster: %v", err)
	}
	if err != nil && !rec.claimed {
		// Nothing changed on the node (e.g. its storage could not be read).
		log.Error("init failed before the node lock", "err", err)
		return status.Errorf(codes.Internal, "init failed, node unchanged: %v", err)
	}
	if err != nil {
		rec.step("init failed: %v", err)
		log.Error("init failed", "err", err)
		if s.cfg.NodeLogs != nil {
			rec.raw(s.cfg.NodeLogs(work))
		}
		rec.flushLog()
		s.finish(err)
		return status.Errorf(codes.Internal, "init failed: %v", err)
	}
	log.Info("cluster initialized", "clusterID", hex.EncodeToString(clusterID), "cluster", r.clusterName)
	s.finish(nil)
	return rec.send(&initpb.InitResponse{Kind: &initpb.InitResponse_Success{Success: &initpb.InitSuccess{Kubeconfig: kubeconfig, ClusterId: clusterID}}})
}

// authenticate admits the attempt (per caller address, before any work) and checks secret
// against the init-secret hash. Its refusals do not depend on the node's state.
func (s *Server) authenticate(ctx context.Context, log *slog.Logger, secret []byte) error {
	var remote net.Addr
	if p, ok := peer.FromContext(ctx); ok {
		remote = p.Addr
	}
	release, err := s.attempts.Admit(ctx, remote)
	if err != nil {
		// Not logged as a warning: a flood would flood the log; the caller is told.
		log.Debug("init refused", "reason", handshakelimit.Reason(err), "err", err)
		return status.Error(codes.ResourceExhausted, err.Error())
	}
	defer release()
	hash, err := s.cfg.Metadata.InitSecretHash(ctx)
	if err != nil {
		return s.refuse(log, codes.Unavailable, "metadata", "reading the init-secret hash from metadata: %v", err)
	}
	if err := bcrypt.CompareHashAndPassword(hash, secret); err != nil {
		return s.refuse(log, codes.PermissionDenied, "init-secret", "wrong init secret")
	}
	return nil
}

func (s *Server) refuse(log *slog.Logger, code codes.Code, reason, format string, args ...any) error {
	err := status.Errorf(code, format, args...)
	log.Warn("init refused", "reason", reason, "err", status.Convert(err).Message())
	return err
}

func (s *Server) initialize(ctx context.Context, r *request, self metadata.Instance, rec *recorder) (kubeconfig, clusterID []byte, err error) {
	measurementSecret, err := r.master.MeasurementSecret()
	if err != nil {
		return nil, nil, err
	}
	if clusterID, err = kms.ClusterID(measurementSecret, r.measurementSalt); err != nil {
		return nil, nil, err
	}
	diskUUID, err := s.cfg.Node.DiskUUID()
	if err != nil {
		return nil, nil, err
	}
	diskKey, err := r.master.StateDiskKey(diskUUID)
	if err != nil {
		return nil, nil, err
	}
	err = s.cfg.Node.Claim(ctx, "init", clusterID, diskKey)
	if errors.Is(err, nodelock.ErrLocked) || errors.Is(err, node.ErrNotFresh) {
		return nil, nil, err
	}
	// Past TryLock the node is marked, whatever else failed.
	rec.claimed = s.cfg.Node.LockHolder() != ""
	if err != nil {
		return nil, nil, err
	}
	rec.step("node lock taken: PCR 15 extended with cluster ID %s", hex.EncodeToString(clusterID))
	rec.step("state storage %s re-keyed to the derived disk key, marked initialized and unlocked", diskUUID)

	if err := s.writePKI(self, r.clusterName); err != nil {
		return nil, nil, err
	}
	rec.step("cluster CAs created in %s; kubelet serving and client certificates issued", s.cfg.PKIDir)
	if err := nodeauthz.WriteAPIServerFiles(s.cfg.APIServerConfigDir, filepath.Join(kubeadmconfig.CertificatesDir, pki.CACert), nodeauthz.Addr); err != nil {
		return nil, nil, err
	}
	if s.cfg.RegistryHostsDir != "" {
		if err := registries.Write(s.cfg.RegistryHostsDir, r.registryMirrors); err != nil {
			return nil, nil, err
		}
		if len(r.registryMirrors) > 0 {
			rec.step("registry mirrors of %s written for containerd", strings.Join(r.registryMirrors.Hosts(), ", "))
		}
	}

	config, err := s.cfg.KubeadmConfig(InitParams{
		Self: self, ClusterName: r.clusterName, KubernetesVersion: r.version,
		APIServerCertSANs: r.sans, ServiceCIDR: r.serviceCIDR, PodCIDR: r.podCIDR, ControlPlaneEndpoint: r.endpoint,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("generating the kubeadm configuration: %w", err)
	}
	rec.step("running kubeadm init (Kubernetes %s)", r.version)
	if err := s.cfg.Kubeadm.Init(ctx, config, rec.lines("kubeadm: ")); err != nil {
		return nil, nil, err
	}
	rec.step("kubeadm init done")
	if kubeconfig, err = os.ReadFile(s.cfg.AdminKubeconfig); err != nil {
		return nil, nil, fmt.Errorf("reading the admin kubeconfig kubeadm wrote: %w", err)
	}
	record, err := recordCluster(ctx, kubeconfig, r, s.cfg.Issuer.Variant(), clusterID, diskUUID, self.Name)
	if err != nil {
		return nil, nil, err
	}
	rec.step("cluster recorded in %s/%s and %s/%s", RecordNamespace, ClusterConfigMapName, RecordNamespace, MasterSecretSecretName)
	rec.step("state disk %s recorded as node %s's in namespace %s", diskUUID, self.Name, diskowner.Namespace)
	if s.cfg.Deploy != nil {
		rec.step("deploying the join, key and verification services")
		err := s.cfg.Deploy(ctx, Deployment{Kubeconfig: kubeconfig, Cluster: record, Attestation: *r.attestation, RegistryMirrors: r.registryMirrors,
			APIEndpoint: r.endpoint, Progress: func(msg string) { rec.step("deploy: %s", msg) }})
		if err != nil {
			return nil, nil, fmt.Errorf("deploying the in-cluster services: %w", err)
		}
		rec.step("in-cluster services deployed")
	}
	return kubeconfig, clusterID, nil
}

// writePKI creates the cluster's CAs, the first kubelet's serving certificate and its
// kubeconfig with a short-lived client certificate (kubeadm uses both as they are).
func (s *Server) writePKI(self metadata.Instance, clusterName string) error {
	now := time.Now()
	cluster, err := pki.NewCluster(now)
	if err != nil {
		return fmt.Errorf("creating the cluster CAs: %w", err)
	}
	if err := cluster.Write(s.cfg.PKIDir); err != nil {
		return fmt.Errorf("writing the cluster CAs: %w", err)
	}
	leaf := pki.Leaf{
		CommonName: "system:node:" + self.Name, Organizations: []string{"system:nodes"},
		DNSNames: []string{self.Name}, Server: true,
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(kubeletcsr.ServingValidity),
	}
	for _, ip := range self.IPs {
		leaf.IPs = append(leaf.IPs, ip.AsSlice())
	}
	cert, key, err := cluster.CA.NewLeaf(leaf)
	if err != nil {
		return fmt.Errorf("issuing the kubelet serving certificate: %w", err)
	}
	if err := pki.WriteCertAndKey(s.cfg.KubeletPKIDir, kubeadmconfig.KubeletPKIName, cert, key); err != nil {
		return fmt.Errorf("writing the kubelet serving certificate: %w", err)
	}
	clientCert, clientKey, err := kubeletcred.Issue(cluster.CA, self.Name, now)
	if err != nil {
		return err
	}
	// The server kubeadm would write into kubelet.conf of a control plane: its own API server
	// (kubeadm v1.34's ControlPlaneKubeletLocalMode, on by default, which joining control
	// planes get too), not the cluster's endpoint: a kubelet must never be newer than the API
	// server it talks to, which an upgrade through a load balancer could not promise.
	var server string
	if len(self.IPs) > 0 {
		server = netip.AddrPortFrom(self.IPs[0].Unmap(), kubeadmconfig.APIServerPort).String()
	}
	kubeconfig, err := kubeletcred.Kubeconfig(kubeletcred.KubeconfigParams{
		ClusterName: clusterName, Server: server, NodeName: self.Name,
		CACert: pki.EncodeCert(cluster.CA.Cert), ClientCert: clientCert, ClientKey: clientKey,
	})
	if err != nil {
		return fmt.Errorf("the kubelet's kubeconfig: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(s.cfg.KubeletKubeconfig), 0o755); err != nil {
		return err
	}
	if err := fileutil.WriteAtomic(s.cfg.KubeletKubeconfig, kubeconfig, 0o600); err != nil {
		return fmt.Errorf("writing the kubelet's kubeconfig: %w", err)
	}
	return nil
}

// ClusterRecord is the public part of what init records in ConfigMap
// kube-system/constellation-cluster (key "cluster.json").
type ClusterRecord = clusterrecord.Cluster

// ComponentRecord is one Kubernetes artifact nodes install.
type ComponentRecord = clusterrecord.Component

// recordCluster records the cluster, and that this node's state disk is this node's: the
// init node never asks the join service for a join ticket, so without this record its
// rebooted self would get no rejoin ticket (internal/diskowner).
func recordCluster(ctx context.Context, kubeconfig []byte, r *request, v variant.Variant, clusterID []byte, diskUUID, nodeName string) (ClusterRecord, error) {
	restCfg, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	if err != nil {
		return ClusterRecord{}, fmt.Errorf("admin kubeconfig: %w", err)
	}
	restCfg.Timeout = 30 * time.Second
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return ClusterRecord{}, fmt.Errorf("admin kubeconfig: %w", err)
	}
	rec := ClusterRecord{
		Name: r.clusterName, ClusterID: hex.EncodeToString(clusterID),
		MeasurementSalt:   base64.StdEncoding.EncodeToString(r.measurementSalt),
		KubernetesVersion: r.version,
		ClusterIDMarker:   hex.EncodeToString(v.ClusterIDMarker(clusterID)),
	}
	for _, c := range r.components {
		rec.KubernetesComponents = append(rec.KubernetesComponents, ComponentRecord{Name: c.GetName(), URL: c.GetUrl(), Hash: c.GetHash(), InstallPath: c.GetInstallPath()})
	}
	recJSON, err := json.Marshal(rec)
	if err != nil {
		return ClusterRecord{}, err
	}
	secretJSON, err := json.Marshal(r.master)
	if err != nil {
		return ClusterRecord{}, err
	}
	labels := map[string]string{"app.kubernetes.io/managed-by": "constellation-bootstrapper"}
	if _, err := client.CoreV1().Secrets(RecordNamespace).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: MasterSecretSecretName, Namespace: RecordNamespace, Labels: labels},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{clusterrecord.MasterSecretKey: secretJSON},
		Immutable:  ptrTo(true),
	}, metav1.CreateOptions{}); err != nil {
		return ClusterRecord{}, fmt.Errorf("recording the master secret: %w", err)
	}
	if _, err := client.CoreV1().ConfigMaps(RecordNamespace).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: ClusterConfigMapName, Namespace: RecordNamespace, Labels: labels},
		Data:       map[string]string{clusterrecord.ClusterKey: string(recJSON)},
		Immutable:  ptrTo(true),
	}, metav1.CreateOptions{}); err != nil {
		return ClusterRecord{}, fmt.Errorf("recording the cluster: %w", err)
	}
	if err := diskowner.EnsureNamespace(ctx, client); err != nil {
		return ClusterRecord{}, fmt.Errorf("recording the owner of this node's state disk: %w", err)
	}
	owner, err := diskowner.Store{Client: client}.Claim(ctx, diskUUID, nodeName)
	if err != nil {
		return ClusterRecord{}, fmt.Errorf("recording the owner of this node's state disk: %w", err)
	}
	if owner != nodeName {
		return ClusterRecord{}, fmt.Errorf("state disk %s is recorded as node %q's, not this node's (%q)", diskUUID, owner, nodeName)
	}
	return rec, nil
}

func ptrTo[T any](v T) *T { return &v }

// recorder streams progress to the caller and keeps the log of this init.
type recorder struct {
	stream initpb.InitService_InitServer
	log    *slog.Logger

	mu       sync.Mutex
	buf      bytes.Buffer
	detached bool // the caller went away: keep working, stop sending
	claimed  bool // the node lock was taken by this init
}

func newRecorder(stream initpb.InitService_InitServer, log *slog.Logger) *recorder {
	return &recorder{stream: stream, log: log}
}

func (r *recorder) send(m *initpb.InitResponse) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sendLocked(m)
}

func (r *recorder) sendLocked(m *initpb.InitResponse) error {
	if r.detached {
		return nil
	}
	if err := r.stream.Send(m); err != nil {
		r.detached = true
		r.log.Warn("caller went away; init continues", "err", err)
		return err
	}
	return nil
}

// step records and streams one progress message.
func (r *recorder) step(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	r.log.Info(msg)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.appendLog([]byte(time.Now().UTC().Format(time.RFC3339) + " " + msg + "\n"))
	_ = r.sendLocked(&initpb.InitResponse{Kind: &initpb.InitResponse_Progress{Progress: &initpb.InitProgress{Message: msg}}})
}

// raw adds data to the log without streaming it as progress.
func (r *recorder) raw(data []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.appendLog(data)
}

func (r *recorder) appendLog(data []byte) {
	r.buf.Write(data)
	if r.buf.Len() > maxLogSize {
		tail := append([]byte(nil), r.buf.Bytes()[r.buf.Len()-maxLogSize/2:]...)
		r.buf.Reset()
		r.buf.WriteString("[... earlier log dropped ...]\n")
		r.buf.Write(tail)
	}
}

// lines returns a writer that streams every line written to it as progress.
func (r *recorder) lines(prefix string) io.Writer { return &lineWriter{r: r, prefix: prefix} }

// flushLog streams the kept log in chunks.
func (r *recorder) flushLog() {
	r.mu.Lock()
	defer r.mu.Unlock()
	data := r.buf.Bytes()
	for len(data) > 0 {
		n := min(len(data), logChunkSize)
		if r.sendLocked(&initpb.InitResponse{Kind: &initpb.InitResponse_Log{Log: &initpb.InitLog{Data: data[:n]}}}) != nil {
			return
		}
		data = data[n:]
	}
}

type lineWriter struct {
	r       *recorder
	prefix  string
	pending []byte
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.pending = append(w.pending, p...)
	for {
		i := bytes.IndexByte(w.pending, '\n')
		if i < 0 {
			break
		}
		if line := strings.TrimSpace(string(w.pending[:i])); line != "" {
			w.r.step("%s%s", w.prefix, line)
		}
		w.pending = w.pending[i+1:]
	}
	return len(p), nil
}

// apiEndpoint is the cluster's stable API endpoint: the platform's (its load balancer in
// front of every control plane), or, where the platform has none, this node's address, as
// kubeadm's default would be. It is where every kubeconfig points, so it is fixed for the
// cluster's life here.
func apiEndpoint(ctx context.Context, md metadata.Provider, self metadata.Instance) (string, error) {
	ep, err := md.APIEndpoint(ctx)
	if err != nil {
		return "", fmt.Errorf("reading the cluster's API endpoint from metadata: %w", err)
	}
	if ep != "" {
		return ep, nil
	}
	return netip.AddrPortFrom(self.IPs[0].Unmap(), kubeadmconfig.APIServerPort).String(), nil
}
