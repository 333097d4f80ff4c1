// Package joinservice admits attested nodes into the cluster (docs/design.md "1.5 Joins",
// "1.8 Reference values change without a gap"). It serves gRPC over the attested channel
// only, in mutual mode: it verifies every node's evidence, and presents its own so that nodes
// can refuse an impostor (ServiceCheck).
//
// An admission, in order, stopping at the first failure:
//
//  0. accept-time bounds on connections whose attested handshake has not finished
//     (internal/handshakelimit.AcceptLimiter): per peer address and in all, with a handshake
//     deadline, so connections that stall before or during TLS are refused or closed before
//     they cost more than a socket;
//  1. handshake admission, before any TPM quote or verification (atls.Config.Admit with an
//     internal/handshakelimit.Limiter): a rate per peer address, a bound on one peer's
//     handshakes in progress and one on all handshakes in progress;
//  2. evidence verified against the active reference sets, with a size cap (the attested
//     handshake);
//  3. the platform names the node and its addresses (Platform);
//  4. the request is checked: disk UUID, the kubelet CSR against that identity, the
//     control-plane flag against the node's role;
//  5. the measurements are matched again against the reference sets in force right now, so
//     no ticket is issued on a set retired while the handshake ran;
//  6. keys derived (key service) and the kubelet's serving and client certificates signed
//     for the node's own name: nothing is written anywhere, so a rejected node leaves
//     nothing behind (the disk-owner record of step 5's join is the one exception, see
//     claimDisk).
//
// IssueVolumeKey passes steps 0-3 and 5 too, then releases an encrypted volume's key only to
// a node that has the volume attached and a pod using it, read fresh from the API server
// (VolumeUse; docs/joinservice.md, "Volume keys").
//
// A ticket carries no bootstrap token: a node authenticates to the API server with the
// short-lived client certificate from the start, and renews it only for its own name
// (internal/kube/kubeletcsr; docs/joinservice.md, "Node credentials").
//
// Every decision is one log line (accepted or rejected, naming peer, node, variant, and the
// matching set or the reason) and is counted in Prometheus metrics; every refusal is also
// kept in a bounded book by peer (Refusals), which cmd/joinservice publishes in the cluster
// for the CLI (internal/joinservice/refusals).
package joinservice

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"k8s.io/client-go/kubernetes"

	"github.com/openconstellation/constellation/api/join/joinpb"
	"github.com/openconstellation/constellation/internal/diskowner"
	"github.com/openconstellation/constellation/internal/handshakelimit"
	"github.com/openconstellation/constellation/internal/joinservice/refusals"
	"github.com/openconstellation/constellation/internal/kms"
	"github.com/openconstellation/constellation/internal/kube/kubeletcsr"
	"github.com/openconstellation/constellation/internal/pki"
	"github.com/openconstellation/constellation/internal/registries"
	"github.com/openconstellation/constellation/internal/statedisk"
	"github.com/openconstellation/constellation/pkg/atls"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/untrusted"
)

// Keys derives keys; the key service client implements it.
type Keys interface {
	DataKey(ctx context.Context, id string, length int) ([]byte, error)
}

// Defaults of Config.
const (
	DefaultRateLimit               = rate.Limit(1) // per second, per peer address
	DefaultRateBurst               = 5
	DefaultMaxHandshakesPerPeer    = 2
	DefaultMaxConcurrentHandshakes = 16
	DefaultMaxWaitingHandshakes    = 256
)

// DefaultAcceptLimits bound the connections whose attested handshake has not finished (step
// 0). A node opens one connection per attempt; 4 per address leaves room for the 2 handshakes
// in progress step 1 allows. 512 in all holds step 1's 16 working + 256 waiting handshakes
// with room to spare, and keeps what stalled connections hold near 11 MB even when each sent
// half a ClientHello (a pending connection holds 15-22 KiB: docs/benchmarks.md).
var DefaultAcceptLimits = handshakelimit.AcceptLimits{PerPeer: 4, Total: 512, Timeout: atls.DefaultHandshakeTimeout}

// defaultHandshakeLimits are the defaults above as the limiter takes them.
var defaultHandshakeLimits = handshakelimit.Limits{
	Rate: DefaultRateLimit, Burst: DefaultRateBurst, PerPeer: DefaultMaxHandshakesPerPeer,
	Concurrent: DefaultMaxConcurrentHandshakes, Waiting: DefaultMaxWaitingHandshakes, What: "join attempts",
}

// Config configures the join service.
type Config struct {
	// Issuer attests the service to joining nodes. It quotes once per join, on the join's
	// critical path, so give it the TPM's ECC AK (vtpm.AKECC): ~3x cheaper to quote on swtpm.
	Issuer attestation.Issuer
	// Validator checks joining nodes' evidence; it must read its reference sets from Active.
	Validator attestation.Validator
	// Active holds the reference sets in force (hot-reloaded by a measurements.Watcher).
	Active *measurements.Active
	// Keys derives the state-disk keys and the measurement secret.
	Keys Keys
	// MeasurementSalt is the cluster's measurement salt, handed to nodes with the secret.
	MeasurementSalt []byte
	// Kube records which node each state disk belongs to and reads the removed-node records
	// (internal/diskowner).
	Kube kubernetes.Interface
	// PKIDir is the control plane's PKI directory in kubeadm's layout: the cluster CA signs
	// kubelet certificates; control-plane nodes receive pki.ControlPlaneFiles.
	PKIDir   string
	Platform Platform
	// Volumes answers whether a node may have a volume's key (IssueVolumeKey); nil: read
	// from the API server through Kube (KubeVolumes), as cmd/joinservice does.
	Volumes VolumeUse

	// APIServerEndpoint (host:port), KubernetesVersion and KubernetesComponents are passed
	// to nodes in the ticket.
	APIServerEndpoint    string
	KubernetesVersion    string
	KubernetesComponents []*joinpb.KubernetesComponent
	// RegistryMirrors returns the cluster's registry mirrors as recorded now, for every ticket
	// (nodes take changes at their next join or reboot); nil: none.
	RegistryMirrors func() (registries.Mirrors, error)

	// RateLimit and RateBurst bound handshakes per peer address (defaults 1/s, burst 5).
	RateLimit rate.Limit
	RateBurst int
	// MaxHandshakesPerPeer bounds one peer address's handshakes in progress (default 2).
	MaxHandshakesPerPeer int
	// MaxConcurrentHandshakes bound the handshakes quoting and verifying at once (default
	// 16); up to MaxWaitingHandshakes more wait for a turn (default 256), within their
	// deadline, and further ones are refused at once. Waiting costs no TPM or CPU work.
	MaxConcurrentHandshakes int
	MaxWaitingHandshakes    int
	// AcceptLimits bound connections whose attested handshake has not finished, from the
	// moment they are accepted; their Timeout is the handshake deadline (TLS, attestation and
	// the HTTP/2 preface). Unset limits: those of DefaultAcceptLimits.
	AcceptLimits handshakelimit.AcceptLimits
	// MaxEvidenceSize defaults to attestation.DefaultMaxEvidenceSize.
	MaxEvidenceSize int

	Now        func() time.Time
	Log        *slog.Logger
	Registerer prometheus.Registerer
}

// Service implements joinpb.JoinServiceServer.
type Service struct {
	joinpb.UnimplementedJoinServiceServer
	cfg           Config
	ca            *pki.CA
	limiter       *handshakelimit.Limiter
	acceptLimiter *handshakelimit.AcceptLimiter
	// logLimiter keeps floods of rejections out of the log (counters count them all).
	logLimiter *logLimiter
	// refusals are the recent refusals by peer, which cmd/joinservice publishes for the CLI.
	refusals *refusals.Book
	owners   diskowner.Store
	volumes  VolumeUse
	creds    credentials.TransportCredentials
	log      *slog.Logger
	metrics  *metrics
}

// New checks cfg, loads the cluster CA and returns the service.
func New(cfg Config) (*Service, error) {
	switch {
	case cfg.Issuer == nil:
		return nil, errors.New("join service: no issuer (nodes verify the join service)")
	case cfg.Validator == nil || cfg.Active == nil:
		return nil, errors.New("join service: no validator or reference sets")
	case cfg.Validator.Variant().String() != cfg.Active.Variant().String():
		return nil, fmt.Errorf("join service: validator is for %s, reference sets for %s", cfg.Validator.Variant(), cfg.Active.Variant())
	case cfg.Keys == nil || cfg.Kube == nil || cfg.Platform == nil:
		return nil, errors.New("join service: keys, Kubernetes client and platform are required")
	case len(cfg.MeasurementSalt) == 0:
		return nil, errors.New("join service: no measurement salt")
	case cfg.APIServerEndpoint == "" || cfg.KubernetesVersion == "":
		return nil, errors.New("join service: API server endpoint and Kubernetes version are required")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	ca, err := pki.LoadCA(filepath.Join(cfg.PKIDir, pki.CACert), filepath.Join(cfg.PKIDir, pki.CAKey))
	if err != nil {
		return nil, fmt.Errorf("join service: cluster CA: %w", err)
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	limiter, err := handshakelimit.New(handshakelimit.Limits{
		Rate: cfg.RateLimit, Burst: cfg.RateBurst, PerPeer: cfg.MaxHandshakesPerPeer,
		Concurrent: cfg.MaxConcurrentHandshakes, Waiting: cfg.MaxWaitingHandshakes,
	}.Or(defaultHandshakeLimits), cfg.Now)
	if err != nil {
		return nil, fmt.Errorf("join service: %w", err)
	}
	s := &Service{
		cfg: cfg, ca: ca, log: cfg.Log, metrics: m, limiter: limiter,
		logLimiter: newLogLimiter(rejectLogInterval, rejectLogRate, rejectLogBurst, cfg.Now),
		refusals:   refusals.NewBook(),
		owners:     diskowner.Store{Client: cfg.Kube},
		volumes:    cfg.Volumes,
	}
	if s.volumes == nil {
		s.volumes = KubeVolumes{Client: cfg.Kube}
	}
	s.acceptLimiter, err = handshakelimit.NewAcceptLimiter(cfg.AcceptLimits.Or(DefaultAcceptLimits), s.observeAccept)
	if err != nil {
		return nil, fmt.Errorf("join service: %w", err)
	}
	creds, err := atls.NewCredentials(atls.Config{
		Issuer:           cfg.Issuer,
		Validators:       []attestation.Validator{cfg.Validator},
		MaxEvidenceSize:  cfg.MaxEvidenceSize,
		HandshakeTimeout: s.acceptLimiter.Limits().Timeout,
		Admit:            limiter.Admit,
	})
	if err != nil {
		return nil, fmt.Errorf("join service: %w", err)
	}
	s.creds = observedCredentials{Credentials: creds, svc: s}
	return s, nil
}

// Refusals returns the book of the service's recent refusals, for publishing
// (refusals.Publisher).
func (s *Service) Refusals() *refusals.Book { return s.refusals }

// NewGRPCServer returns the gRPC server to serve the service with: mutual attested-channel
// credentials, every connection bounded from the moment it is accepted (step 0), the
// service registered. opts are added.
func (s *Service) NewGRPCServer(opts ...grpc.ServerOption) *handshakelimit.GRPCServer {
	g := handshakelimit.NewGRPCServer(s.acceptLimiter, s.creds, opts...)
	joinpb.RegisterJoinServiceServer(g, s)
	return g
}

// admitted is a peer that passed steps 1-3.
type admitted struct {
	remote   netip.Addr
	verified *attestation.Verified
	node     Node
}

// admit identifies the caller: its verified evidence (from the handshake) and the platform's
// word on who it is.
func (s *Service) admit(ctx context.Context) (*admitted, error) {
	a := &admitted{}
	if p, ok := peer.FromContext(ctx); ok {
		a.remote = handshakelimit.AddrOf(p.Addr)
	}
	verified, ok := atls.PeerFromContext(ctx)
	if !ok {
		return a, deny(codes.Unauthenticated, "unattested", "no verified evidence: the join service is served over the attested channel only")
	}
	a.verified = verified
	node, err := s.cfg.Platform.Node(ctx, verified, a.remote)
	if err != nil {
		return a, deny(codes.PermissionDenied, "unknown-node", "platform does not know this node: %v", err)
	}
	a.node = node
	// A node removed from the cluster stays refused, even if the platform lists its name
	// again: neither a join nor a rejoin (and so none of its disks' keys).
	removed, err := s.owners.Removed(ctx, node.Name)
	if err != nil {
		return a, deny(codes.Unavailable, "kubernetes-api", "checking whether node %q was removed: %v", node.Name, err)
	}
	if removed {
		return a, deny(codes.PermissionDenied, "removed-node", "node %q was removed from the cluster: it is refused from then on", node.Name)
	}
	return a, nil
}

// recheck matches the peer's verified measurements against the reference sets in force now.
func (s *Service) recheck(a *admitted) (string, error) {
	res, err := s.cfg.Active.Load().Match(a.verified.Variant, a.verified.Registers)
	if err != nil {
		return "", deny(codes.PermissionDenied, "reference-set-retired", "measurements no longer match any active reference set (retired during the join): %v", err)
	}
	return res.Set, nil
}

// outcome is what an accepted request records besides the caller.
type outcome struct {
	set, role string
	logArgs   []any
}

// decide runs one request: identify the caller (admit), let issue check the request and build
// the ticket, and record the decision either way: one log line and the metrics.
func decide[R any](ctx context.Context, s *Service, method string, issue func(*admitted) (R, outcome, error)) (R, error) {
	start := s.cfg.Now()
	var resp R
	var out outcome
	a, err := s.admit(ctx)
	if err == nil {
		resp, out, err = issue(a)
	}
	if err != nil {
		s.reject(method, a.remote, a.node.Name, reasonOf(err), err, start)
		var zero R
		return zero, err
	}
	s.accept(method, a, out, start)
	s.metrics.tickets.WithLabelValues(method, out.role).Inc()
	return resp, nil
}

// IssueJoinTicket admits a new node.
func (s *Service) IssueJoinTicket(ctx context.Context, req *joinpb.IssueJoinTicketRequest) (*joinpb.IssueJoinTicketResponse, error) {
	return decide(ctx, s, "join", func(a *admitted) (*joinpb.IssueJoinTicketResponse, outcome, error) {
		return s.issueJoinTicket(ctx, a, req)
	})
}

func (s *Service) issueJoinTicket(ctx context.Context, a *admitted, req *joinpb.IssueJoinTicketRequest) (*joinpb.IssueJoinTicketResponse, outcome, error) {
	diskID, err := diskKeyID(req.DiskUuid)
	if err != nil {
		return nil, outcome{}, err
	}
	if req.IsControlPlane && !a.node.ControlPlane {
		return nil, outcome{}, deny(codes.PermissionDenied, "role", "node %q asks to join as control plane, but the platform says it is a worker", a.node.Name)
	}
	servingCSR, err := kubeletcsr.CheckServing(req.CertificateRequest, kubeletcsr.Node{Name: a.node.Name, Addresses: a.node.Addresses})
	if err != nil {
		return nil, outcome{}, deny(codes.PermissionDenied, "certificate-request", "serving certificate: %v", err)
	}
	clientCSR, err := kubeletcsr.CheckClient(req.ClientCertificateRequest, a.node.Name)
	if err != nil {
		return nil, outcome{}, deny(codes.PermissionDenied, "certificate-request", "client certificate: %v", err)
	}
	var cpFiles []*joinpb.ControlPlaneFile
	if req.IsControlPlane {
		files, err := pki.ReadControlPlaneFiles(s.cfg.PKIDir)
		if err != nil {
			return nil, outcome{}, deny(codes.Internal, "internal", "reading control-plane files: %v", err)
		}
		for _, name := range pki.ControlPlaneFiles {
			cpFiles = append(cpFiles, &joinpb.ControlPlaneFile{Name: name, Data: files[name]})
		}
	}
	set, err := s.recheck(a)
	if err != nil {
		return nil, outcome{}, err
	}
	// The disk's key goes only to the node the disk belongs to; the first join ticket for a
	// disk records that node.
	if err := s.claimDisk(ctx, a, diskID); err != nil {
		return nil, outcome{}, err
	}

	mirrors, err := s.registryMirrors()
	if err != nil {
		return nil, outcome{}, err
	}
	diskKey, measurementSecret, err := s.keys(ctx, diskID)
	if err != nil {
		return nil, outcome{}, err
	}
	now := s.cfg.Now()
	servingCert, err := kubeletcsr.IssueServing(s.ca, servingCSR, now)
	if err != nil {
		return nil, outcome{}, deny(codes.Internal, "internal", "signing the kubelet serving certificate: %v", err)
	}
	clientCert, err := kubeletcsr.IssueClient(s.ca, clientCSR, now)
	if err != nil {
		return nil, outcome{}, deny(codes.Internal, "internal", "signing the kubelet client certificate: %v", err)
	}
	role := "worker"
	if req.IsControlPlane {
		role = "control-plane"
	}
	return &joinpb.IssueJoinTicketResponse{
		StateDiskKey:         diskKey,
		MeasurementSecret:    measurementSecret,
		MeasurementSalt:      s.cfg.MeasurementSalt,
		ApiServerEndpoint:    s.cfg.APIServerEndpoint,
		KubeletCert:          pki.EncodeCert(servingCert),
		KubeletClientCert:    pki.EncodeCert(clientCert),
		ClusterCaCert:        pki.EncodeCert(s.ca.Cert),
		KubernetesVersion:    s.cfg.KubernetesVersion,
		KubernetesComponents: s.cfg.KubernetesComponents,
		ControlPlaneFiles:    cpFiles,
		RegistryMirrors:      mirrors,
	}, outcome{set: set, role: role, logArgs: []any{"clientCertNotAfter", clientCert.NotAfter}}, nil
}

// IssueRejoinTicket lets a rebooted node unlock its state.
func (s *Service) IssueRejoinTicket(ctx context.Context, req *joinpb.IssueRejoinTicketRequest) (*joinpb.IssueRejoinTicketResponse, error) {
	return decide(ctx, s, "rejoin", func(a *admitted) (*joinpb.IssueRejoinTicketResponse, outcome, error) {
		return s.issueRejoinTicket(ctx, a, req)
	})
}

func (s *Service) issueRejoinTicket(ctx context.Context, a *admitted, req *joinpb.IssueRejoinTicketRequest) (*joinpb.IssueRejoinTicketResponse, outcome, error) {
	diskID, err := diskKeyID(req.DiskUuid)
	if err != nil {
		return nil, outcome{}, err
	}
	clientCSR, err := kubeletcsr.CheckClient(req.ClientCertificateRequest, a.node.Name)
	if err != nil {
		return nil, outcome{}, deny(codes.PermissionDenied, "certificate-request", "client certificate: %v", err)
	}
	set, err := s.recheck(a)
	if err != nil {
		return nil, outcome{}, err
	}
	if err := s.checkDiskOwner(ctx, a, diskID); err != nil {
		return nil, outcome{}, err
	}
	mirrors, err := s.registryMirrors()
	if err != nil {
		return nil, outcome{}, err
	}
	diskKey, measurementSecret, err := s.keys(ctx, diskID)
	if err != nil {
		return nil, outcome{}, err
	}
	clientCert, err := kubeletcsr.IssueClient(s.ca, clientCSR, s.cfg.Now())
	if err != nil {
		return nil, outcome{}, deny(codes.Internal, "internal", "signing the kubelet client certificate: %v", err)
	}
	return &joinpb.IssueRejoinTicketResponse{
		StateDiskKey: diskKey, MeasurementSecret: measurementSecret, MeasurementSalt: s.cfg.MeasurementSalt,
		KubeletClientCert: pki.EncodeCert(clientCert), RegistryMirrors: mirrors,
	}, outcome{set: set, role: "any", logArgs: []any{"clientCertNotAfter", clientCert.NotAfter}}, nil
}

// registryMirrors returns the encoded registry mirrors for a ticket, nil for none. A record the
// service cannot read refuses the ticket: a node must not come up without the mirrors its
// operator configured.
func (s *Service) registryMirrors() ([]byte, error) {
	if s.cfg.RegistryMirrors == nil {
		return nil, nil
	}
	m, err := s.cfg.RegistryMirrors()
	if err != nil {
		return nil, deny(codes.Internal, "internal", "the cluster's registry mirrors: %v", err)
	}
	if len(m) == 0 {
		return nil, nil
	}
	data, err := m.Encode()
	if err != nil {
		return nil, deny(codes.Internal, "internal", "the cluster's registry mirrors: %v", err)
	}
	return data, nil
}

func (s *Service) keys(ctx context.Context, diskID string) (diskKey, measurementSecret []byte, err error) {
	// The key service derives what kms.MasterSecret.StateDiskKey derives for this disk.
	if diskKey, err = s.cfg.Keys.DataKey(ctx, diskID, statedisk.KeySize); err != nil {
		return nil, nil, deny(codes.Unavailable, "key-service", "deriving state-disk key: %v", err)
	}
	if measurementSecret, err = s.cfg.Keys.DataKey(ctx, kms.MeasurementID, kms.DerivedKeySize); err != nil {
		return nil, nil, deny(codes.Unavailable, "key-service", "deriving measurement secret: %v", err)
	}
	return diskKey, measurementSecret, nil
}

// diskKeyID returns the key id of a state disk: its UUID in lower case (docs/design.md
// "2.2 Derived keys").
func diskKeyID(uuid string) (string, error) {
	id, err := diskowner.CanonicalUUID(uuid)
	if err != nil {
		return "", deny(codes.InvalidArgument, "invalid-request", "disk UUID %s is not of the form 8-4-4-4-12 hex digits", untrusted.Quote(uuid))
	}
	return id, nil
}

// claimDisk records the caller as the owner of disk diskID, or confirms it is already: a
// join interrupted after the record and retried by the same node goes through, a join of
// another node's disk does not.
func (s *Service) claimDisk(ctx context.Context, a *admitted, diskID string) error {
	owner, err := s.owners.Claim(ctx, diskID, a.node.Name)
	if err != nil {
		return deny(codes.Unavailable, "kubernetes-api", "recording the owner of disk %s: %v", diskID, err)
	}
	if owner != a.node.Name {
		return deny(codes.PermissionDenied, "disk-owned-by-other-node", "disk %s belongs to another node (recorded when it joined); node %q gets no key for it", diskID, a.node.Name)
	}
	return nil
}

// checkDiskOwner lets a rejoin through only for the node recorded as the disk's owner.
func (s *Service) checkDiskOwner(ctx context.Context, a *admitted, diskID string) error {
	owner, err := s.owners.Owner(ctx, diskID)
	switch {
	case errors.Is(err, diskowner.ErrNoRecord):
		return deny(codes.PermissionDenied, "disk-not-recorded", "disk %s has no recorded owner: it never joined this cluster (a node joins with IssueJoinTicket first)", diskID)
	case err != nil:
		return deny(codes.Unavailable, "kubernetes-api", "reading the owner of disk %s: %v", diskID, err)
	case owner != a.node.Name:
		return deny(codes.PermissionDenied, "disk-owned-by-other-node", "disk %s belongs to another node (recorded when it joined); node %q gets no key for it", diskID, a.node.Name)
	}
	return nil
}

func (s *Service) accept(method string, a *admitted, out outcome, start time.Time) {
	s.metrics.latency.WithLabelValues(method, "accepted").Observe(s.cfg.Now().Sub(start).Seconds())
	args := []any{"method", method, "peer", a.remote.String(), "node", a.node.Name, "role", out.role,
		"variant", a.verified.Variant.String(), "referenceSet", out.set, "signer", a.verified.SignerID}
	if len(a.verified.Warnings) > 0 {
		args = append(args, "warnings", a.verified.Warnings)
	}
	s.log.Info("admission accepted", append(args, out.logArgs...)...)
}

// decision is a refused request: the gRPC status the node sees, and the reason label of logs
// and metrics.
type decision struct {
	reason string
	st     *status.Status
}

func (d *decision) Error() string              { return d.st.Err().Error() }
func (d *decision) GRPCStatus() *status.Status { return d.st }

func deny(code codes.Code, reason, format string, args ...any) error {
	return &decision{reason: reason, st: status.Newf(code, format, args...)}
}

// reasonOf labels a handler error for metrics.
func reasonOf(err error) string {
	var d *decision
	if errors.As(err, &d) {
		return d.reason
	}
	return "internal"
}
