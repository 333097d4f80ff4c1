package joinclient

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"

	"github.com/openconstellation/constellation/api/join/joinpb"
	"github.com/openconstellation/constellation/internal/bootstrapper/node"
	"github.com/openconstellation/constellation/internal/bootstrapper/nodelock"
	"github.com/openconstellation/constellation/internal/fileutil"
	"github.com/openconstellation/constellation/internal/joinservice"
	"github.com/openconstellation/constellation/internal/kms"
	"github.com/openconstellation/constellation/internal/kube/kubeadm"
	"github.com/openconstellation/constellation/internal/kube/kubeadmconfig"
	"github.com/openconstellation/constellation/internal/kube/kubeletcred"
	"github.com/openconstellation/constellation/internal/kube/kubeletcsr"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/nodeauthz"
	"github.com/openconstellation/constellation/internal/pki"
	"github.com/openconstellation/constellation/internal/registries"
	"github.com/openconstellation/constellation/internal/statedisk"
	"github.com/openconstellation/constellation/pkg/atls"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/untrusted"
)

// Files the join client writes for the kubelet: its serving certificate, signed by the
// cluster CA from the node's CSR, and the key that never left the node. The client
// certificate goes into the kubelet's certificate store (kubeletcred.StoreClientCert)
// on a rejoin, and into the discovery file kubeadm joins with on a join.
var (
	KubeletCertFile = filepath.Base(kubeadmconfig.KubeletCertFile)
	KubeletKeyFile  = filepath.Base(kubeadmconfig.KubeletKeyFile)
)

// DefaultAttemptTimeout bounds one call to one join service.
const DefaultAttemptTimeout = 30 * time.Second

// ErrInitWon is returned by Join when init took the node lock first.
var ErrInitWon = errors.New("join stopped: this node was initialized by init instead")

// Dialer connects to a join service over the mutually attested channel. The context of a
// call carries the attempt's connection observer (see AttestedDialer): a Dialer that wraps
// AttestedDialer must pass it on. The connections of a Dialer that does not are not observed,
// and every failure of theirs counts as a refusal (exponential back-off, never fast polling).
type Dialer func(ctx context.Context, endpoint string) (*grpc.ClientConn, error)

// AttestedDialer returns a Dialer whose connections attest the node with issuer and verify
// the service with serviceValidator (joinservice.ServiceCheck: same image, initialized).
// Each connection reports to the observer in the Dial context whether its TCP connection was
// established and how the attested handshake ended, so a failed attempt is classified as
// unreachable or refused (package documentation).
func AttestedDialer(issuer attestation.Issuer, serviceValidator attestation.Validator) (Dialer, error) {
	creds, err := atls.NewCredentials(atls.Config{Issuer: issuer, Validators: []attestation.Validator{serviceValidator}})
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, endpoint string) (*grpc.ClientConn, error) {
		var tc credentials.TransportCredentials = creds
		if obs := observerFrom(ctx); obs != nil {
			tc = obs.watch(creds)
		}
		return grpc.NewClient("passthrough:///"+endpoint, grpc.WithTransportCredentials(tc))
	}, nil
}

// JoinParams is what the kubeadm join configuration depends on.
type JoinParams struct {
	Self metadata.Instance
	// DiscoveryFile is the kubeconfig with the ticket's API server, CA and client certificate.
	DiscoveryFile     string
	ControlPlane      bool
	KubernetesVersion string
}

// KubeadmConfig returns the join configuration builder of a node image with settings s
// (internal/kube/kubeadmconfig).
func KubeadmConfig(s kubeadmconfig.NodeSettings) func(JoinParams) ([]byte, error) {
	return func(p JoinParams) ([]byte, error) {
		var nodeIP netip.Addr
		if len(p.Self.IPs) > 0 {
			nodeIP = p.Self.IPs[0]
		}
		return kubeadmconfig.Join(kubeadmconfig.JoinParams{
			NodeName: p.Self.Name, NodeIP: nodeIP, CRISocket: s.CRISocket,
			DiscoveryFile: p.DiscoveryFile, ControlPlane: p.ControlPlane, Sandbox: s.Sandbox, ComponentWait: s.ComponentWait,
		})
	}
}

// Config configures the join client.
type Config struct {
	Node     *node.Node
	Metadata metadata.Provider
	Dial     Dialer
	// Kubeadm runs `kubeadm join` with the configuration KubeadmConfig builds.
	Kubeadm       node.Kubeadm
	KubeadmConfig func(JoinParams) ([]byte, error)
	// Kubelet restarts the kubelet on the reboot path.
	Kubelet node.Kubelet
	// PKIDir is kubeadm's PKI directory (/etc/kubernetes/pki); KubeletPKIDir the kubelet's
	// (/var/lib/kubelet/pki).
	PKIDir, KubeletPKIDir string
	// DiscoveryFile is where the join writes the kubeconfig kubeadm joins with (the ticket's
	// API server, CA and the node's client certificate and key); it is removed when kubeadm
	// join returns (kubeadm has copied it for the kubelet's TLS bootstrap, and removes that
	// copy itself).
	DiscoveryFile string
	// APIServerConfigDir is where a control plane's API server reads the removed-node
	// authorizer's configuration (nodeauthz.ConfigDir): written before kubeadm join.
	APIServerConfigDir string
	// RegistryHostsDir is where the node's containerd reads its registry hosts
	// (registries.HostsDir): the ticket's registry mirrors are written there after the
	// commit, at join and rejoin. Empty: the node's registries are not configured.
	RegistryHostsDir string
	// Clock drives the waits between attempts (default: real clock). PollInterval is the
	// wait while no join service answers (default PollInterval), Backoff the schedule after
	// a service refused (default NewBackoff); see the package documentation.
	Clock        clock.Clock
	PollInterval time.Duration
	Backoff      func() wait.Backoff
	// AttemptTimeout bounds one call to one service (DefaultAttemptTimeout).
	AttemptTimeout time.Duration
	Log            *slog.Logger
}

// Client joins a node to its cluster.
type Client struct{ cfg Config }

// New checks cfg and returns a client.
func New(cfg Config) (*Client, error) {
	var missing []string
	for name, v := range map[string]bool{
		"Node": cfg.Node == nil, "Metadata": cfg.Metadata == nil, "Dial": cfg.Dial == nil,
		"Kubeadm": cfg.Kubeadm == nil, "KubeadmConfig": cfg.KubeadmConfig == nil, "Kubelet": cfg.Kubelet == nil,
		"PKIDir": cfg.PKIDir == "", "KubeletPKIDir": cfg.KubeletPKIDir == "", "DiscoveryFile": cfg.DiscoveryFile == "", "APIServerConfigDir": cfg.APIServerConfigDir == "",
	} {
		if v {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return nil, fmt.Errorf("join client: missing %s", strings.Join(missing, ", "))
	}
	scheduleDefaults(&cfg.Clock, &cfg.PollInterval, &cfg.Backoff, &cfg.AttemptTimeout, &cfg.Log)
	return &Client{cfg: cfg}, nil
}

// scheduleDefaults fills the unset parts of a client's schedule (the join client's and the
// volume keys'): real clock, PollInterval, NewBackoff, DefaultAttemptTimeout, no log.
func scheduleDefaults(c *clock.Clock, poll *time.Duration, backoff *func() wait.Backoff, attempt *time.Duration, log **slog.Logger) {
	if *c == nil {
		*c = clock.RealClock{}
	}
	if *poll <= 0 {
		*poll = PollInterval
	}
	if *backoff == nil {
		*backoff = NewBackoff
	}
	if *attempt <= 0 {
		*attempt = DefaultAttemptTimeout
	}
	if *log == nil {
		*log = slog.New(slog.DiscardHandler)
	}
}

// Join gets a join ticket, commits the node to the ticket's cluster (node lock and PCR 15,
// storage), writes the PKI files and runs `kubeadm join`. It retries join services until
// one issues a valid ticket, and returns ErrInitWon as soon as init takes the node lock, or
// ctx's error when ctx ends. In order:
//
//  1. the request: the node's name and disk, the kubelet's two keys and their CSRs;
//  2. the ticket, from whichever join service issues a valid one of the node's cluster;
//  3. commit: node lock, PCR 15, state storage re-keyed and unlocked;
//  4. the files: PKI, the discovery kubeconfig, the API server's authorizer files;
//  5. kubeadm join.
func (c *Client) Join(ctx context.Context) error {
	self, err := c.self(ctx)
	if err != nil {
		return err
	}
	diskUUID, err := c.cfg.Node.DiskUUID()
	if err != nil {
		return err
	}
	keys, req, err := joinRequest(self, diskUUID)
	if err != nil {
		return err
	}
	ticket, err := c.awaitTicket(ctx, req, self, keys)
	if err != nil {
		return err
	}
	if err := c.commit(ctx, ticket); err != nil {
		return err
	}
	c.cfg.Log.Info("node lock taken, PCR 15 extended, state storage unlocked", "disk", diskUUID)
	if err := c.writeJoinFiles(ticket, self, keys); err != nil {
		return err
	}
	// The discovery file holds the client key: it lives only as long as kubeadm needs it.
	defer os.Remove(c.cfg.DiscoveryFile)
	return c.kubeadmJoin(ctx, ticket, self)
}

// kubeletKeys are the kubelet's two keys, one per certificate: the serving key never
// authenticates the node, the client key never serves.
type kubeletKeys struct{ serving, client *ecdsa.PrivateKey }

// joinRequest makes the kubelet's keys and the join ticket request for them.
func joinRequest(self metadata.Instance, diskUUID string) (kubeletKeys, *joinpb.IssueJoinTicketRequest, error) {
	var keys kubeletKeys
	var err error
	if keys.serving, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		return keys, nil, fmt.Errorf("kubelet serving key: %w", err)
	}
	if keys.client, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		return keys, nil, fmt.Errorf("kubelet client key: %w", err)
	}
	servingCSR, err := kubeletcsr.ServingRequest(kubeletcsr.Node{Name: self.Name, Addresses: self.IPs}, keys.serving)
	if err != nil {
		return keys, nil, err
	}
	clientCSR, err := kubeletcsr.ClientRequest(self.Name, keys.client)
	if err != nil {
		return keys, nil, err
	}
	return keys, &joinpb.IssueJoinTicketRequest{
		DiskUuid: diskUUID, CertificateRequest: servingCSR, ClientCertificateRequest: clientCSR,
		IsControlPlane: self.Role == metadata.ControlPlane,
	}, nil
}

// awaitTicket asks join services for a ticket until one issues a valid ticket of the
// service's own cluster. It stops with ErrInitWon as soon as init takes the node lock: the
// loser of the race must not keep asking for tickets.
func (c *Client) awaitTicket(ctx context.Context, req *joinpb.IssueJoinTicketRequest, self metadata.Instance, keys kubeletKeys) (*joinpb.IssueJoinTicketResponse, error) {
	waitCtx, stopWaiting := context.WithCancel(ctx)
	defer stopWaiting()
	go func() {
		select {
		case <-c.cfg.Node.Claimed():
			stopWaiting()
		case <-waitCtx.Done():
		}
	}()
	var ticket *joinpb.IssueJoinTicketResponse
	err := c.retry(waitCtx, func(ctx context.Context, client joinpb.JoinServiceClient, sameCluster func(measurementSecret, measurementSalt []byte) error, opts ...grpc.CallOption) error {
		resp, err := client.IssueJoinTicket(ctx, req, opts...)
		if err != nil {
			return err
		}
		if err := checkTicket(resp, self, keys.serving.Public(), keys.client.Public()); err != nil {
			return fmt.Errorf("invalid join ticket: %w", err)
		}
		if err := sameCluster(resp.MeasurementSecret, resp.MeasurementSalt); err != nil {
			return err
		}
		ticket = resp
		return nil
	})
	stopWaiting()
	if err != nil {
		if c.cfg.Node.LockHolder() != "" {
			return nil, fmt.Errorf("%w (lock taken by %s)", ErrInitWon, c.cfg.Node.LockHolder())
		}
		return nil, err
	}
	return ticket, nil
}

// commit takes the node lock for the ticket's cluster (PCR 15) and re-keys and unlocks the
// state storage with the ticket's disk key.
func (c *Client) commit(ctx context.Context, ticket *joinpb.IssueJoinTicketResponse) error {
	clusterID, err := kms.ClusterID(ticket.MeasurementSecret, ticket.MeasurementSalt)
	if err != nil {
		return err
	}
	if err := c.cfg.Node.Claim(ctx, "join", clusterID, ticket.StateDiskKey); err != nil {
		if errors.Is(err, nodelock.ErrLocked) {
			return fmt.Errorf("%w: %w", ErrInitWon, err)
		}
		return err
	}
	return nil
}

// writeJoinFiles writes the PKI files, the registry mirrors, the discovery kubeconfig with the
// client key, and on a control plane the API server's files for the removed-node authorizer.
func (c *Client) writeJoinFiles(ticket *joinpb.IssueJoinTicketResponse, self metadata.Instance, keys kubeletKeys) error {
	if err := c.writePKI(ticket, keys.serving); err != nil {
		return err
	}
	if err := c.writeRegistryMirrors(ticket.RegistryMirrors); err != nil {
		return err
	}
	if err := c.writeDiscoveryFile(ticket, self.Name, keys.client); err != nil {
		return err
	}
	if self.Role == metadata.ControlPlane {
		return nodeauthz.WriteAPIServerFiles(c.cfg.APIServerConfigDir, filepath.Join(kubeadmconfig.CertificatesDir, pki.CACert), nodeauthz.Addr)
	}
	return nil
}

// kubeadmJoin runs kubeadm join with the configuration for this node and ticket.
func (c *Client) kubeadmJoin(ctx context.Context, ticket *joinpb.IssueJoinTicketResponse, self metadata.Instance) error {
	controlPlane := self.Role == metadata.ControlPlane
	config, err := c.cfg.KubeadmConfig(JoinParams{
		Self: self, DiscoveryFile: c.cfg.DiscoveryFile, ControlPlane: controlPlane,
		KubernetesVersion: ticket.KubernetesVersion,
	})
	if err != nil {
		return fmt.Errorf("generating the kubeadm join configuration: %w", err)
	}
	c.cfg.Log.Info("running kubeadm join", "apiServer", untrusted.Quote(ticket.ApiServerEndpoint), "controlPlane", controlPlane)
	if err := c.cfg.Kubeadm.Join(ctx, config, kubeadm.LogOutput(c.cfg.Log)); err != nil {
		return err
	}
	c.cfg.Log.Info("joined the cluster")
	return nil
}

// Rejoin brings a rebooted node back: rejoin ticket, node lock with the cluster ID, unlock,
// a fresh kubelet client certificate into the kubelet's store, restart the kubelet. Init and
// join are not run again.
func (c *Client) Rejoin(ctx context.Context) error {
	self, err := c.self(ctx)
	if err != nil {
		return err
	}
	diskUUID, err := c.cfg.Node.DiskUUID()
	if err != nil {
		return err
	}
	clientKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("kubelet client key: %w", err)
	}
	clientCSR, err := kubeletcsr.ClientRequest(self.Name, clientKey)
	if err != nil {
		return err
	}
	var ticket *joinpb.IssueRejoinTicketResponse
	err = c.retry(ctx, func(ctx context.Context, client joinpb.JoinServiceClient, sameCluster func(measurementSecret, measurementSalt []byte) error, opts ...grpc.CallOption) error {
		resp, err := client.IssueRejoinTicket(ctx, &joinpb.IssueRejoinTicketRequest{DiskUuid: diskUUID, ClientCertificateRequest: clientCSR}, opts...)
		if err != nil {
			return err
		}
		if len(resp.StateDiskKey) != statedisk.KeySize || len(resp.MeasurementSecret) != kms.DerivedKeySize || len(resp.MeasurementSalt) == 0 {
			return errors.New("invalid rejoin ticket: wrong key sizes")
		}
		if err := checkClientCert(resp.KubeletClientCert, nil, self.Name, clientKey.Public()); err != nil {
			return fmt.Errorf("invalid rejoin ticket: %w", err)
		}
		if _, err := registries.Parse(resp.RegistryMirrors); err != nil {
			return fmt.Errorf("invalid rejoin ticket: %w", err)
		}
		if err := sameCluster(resp.MeasurementSecret, resp.MeasurementSalt); err != nil {
			return err
		}
		ticket = resp
		return nil
	})
	if err != nil {
		return err
	}
	clusterID, err := kms.ClusterID(ticket.MeasurementSecret, ticket.MeasurementSalt)
	if err != nil {
		return err
	}
	if err := c.cfg.Node.Reenter(ctx, clusterID, ticket.StateDiskKey); err != nil {
		return err
	}
	// The certificate was checked before the commit for this node's name, key and use; its
	// signer is the attested service's cluster CA (a wrong one would make the kubelet fail,
	// and the node would reboot and ask again).
	keyPEM, err := pki.EncodeKey(clientKey)
	if err != nil {
		return err
	}
	if err := kubeletcred.StoreClientCert(c.cfg.KubeletPKIDir, ticket.KubeletClientCert, keyPEM); err != nil {
		return err
	}
	if err := c.writeRegistryMirrors(ticket.RegistryMirrors); err != nil {
		return err
	}
	c.cfg.Log.Info("node lock taken, PCR 15 extended, state storage unlocked, kubelet client certificate renewed; restarting the kubelet", "disk", diskUUID)
	if err := c.cfg.Kubelet.Restart(ctx); err != nil {
		return fmt.Errorf("restarting the kubelet: %w", err)
	}
	return nil
}

func (c *Client) self(ctx context.Context) (metadata.Instance, error) {
	self, err := c.cfg.Metadata.Self(ctx)
	if err != nil {
		return metadata.Instance{}, fmt.Errorf("reading this node's metadata: %w", err)
	}
	return self, self.Validate()
}

// call is one RPC to one service. Once the RPC has returned, sameCluster checks that the
// service's node is initialized for the cluster a ticket's measurement secret and salt
// imply (joinservice.CheckClusterID); it fails closed if the channel was not attested.
type call func(ctx context.Context, client joinpb.JoinServiceClient, sameCluster func(measurementSecret, measurementSalt []byte) error, opts ...grpc.CallOption) error

// errNoEndpoints: metadata lists no join service yet (no control plane is up).
var errNoEndpoints = errors.New("metadata lists no join endpoint yet")

// retry tries every endpoint metadata lists, on the schedule of the package documentation,
// until call succeeds on one of them.
func (c *Client) retry(ctx context.Context, do call) error {
	schedule := NewSchedule(c.cfg.PollInterval, c.cfg.Backoff)
	return Retry(ctx, c.cfg.Clock, schedule, c.cfg.Log, func(ctx context.Context) error {
		endpoints, err := c.cfg.Metadata.JoinEndpoints(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			return &AttemptError{Kind: Unreachable, Err: fmt.Errorf("listing join endpoints: %w", err)}
		}
		if len(endpoints) == 0 {
			return &AttemptError{Kind: Unreachable, Err: errNoEndpoints}
		}
		kind := Unreachable
		var failures []error
		for _, ep := range endpoints {
			failed := c.try(ctx, ep, do)
			if failed == nil {
				return nil
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if failed.Kind == Refused {
				kind = Refused
			}
			failures = append(failures, fmt.Errorf("%s: %w", ep, failed.Err))
		}
		return &AttemptError{Kind: kind, Err: errors.Join(failures...)}
	})
}

// try is one call to one endpoint over a fresh attested connection (attempt).
func (c *Client) try(ctx context.Context, endpoint string, do call) *AttemptError {
	return attempt(ctx, c.cfg.Dial, endpoint, c.cfg.AttemptTimeout, do)
}

// attempt is one call to one endpoint over a fresh connection from dial, closed after the
// call and bounded by timeout. A failure is unreachable if the connection never reached a
// service (the dialer's observer saw no TCP connection), refused otherwise.
func attempt(ctx context.Context, dial Dialer, endpoint string, timeout time.Duration, do call) *AttemptError {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	obs := &connObserver{}
	conn, err := dial(withObserver(ctx, obs), endpoint)
	if err != nil {
		// Dial only builds the client (grpc.NewClient connects on the first RPC): no service
		// was contacted.
		return &AttemptError{Kind: Unreachable, Err: fmt.Errorf("dialing: %w", err)}
	}
	defer conn.Close()
	var p peer.Peer
	sameCluster := func(measurementSecret, measurementSalt []byte) error {
		info, ok := p.AuthInfo.(atls.AuthInfo)
		if !ok || info.Peer == nil {
			return errors.New("the join service's connection is not attested")
		}
		return joinservice.CheckClusterID(info.Peer, measurementSecret, measurementSalt)
	}
	if err := do(ctx, joinpb.NewJoinServiceClient(conn), sameCluster, grpc.Peer(&p)); err != nil {
		return obs.classify(err)
	}
	return nil
}

// controlPlaneFiles are the only names a ticket may carry files for: a ticket never writes
// outside the PKI directory.
var controlPlaneFiles = pki.ControlPlaneFiles

// checkTicket checks a ticket before anything of it is used. The service is attested, so
// this guards against bugs and version skew more than against malice, but it is what keeps
// a wrong ticket from writing outside the PKI directory or leaving the node half-joined.
func checkTicket(t *joinpb.IssueJoinTicketResponse, self metadata.Instance, servingPub, clientPub crypto.PublicKey) error {
	return errors.Join(checkTicketFields(t, self), checkTicketCerts(t, self, servingPub, clientPub))
}

// checkTicketFields checks the ticket's sizes, formats and file names.
func checkTicketFields(t *joinpb.IssueJoinTicketResponse, self metadata.Instance) error {
	var problems []error
	bad := func(format string, args ...any) { problems = append(problems, fmt.Errorf(format, args...)) }
	if len(t.StateDiskKey) != statedisk.KeySize {
		bad("state disk key has %d bytes, want %d", len(t.StateDiskKey), statedisk.KeySize)
	}
	if len(t.MeasurementSecret) != kms.DerivedKeySize {
		bad("measurement secret has %d bytes, want %d", len(t.MeasurementSecret), kms.DerivedKeySize)
	}
	if len(t.MeasurementSalt) == 0 {
		bad("no measurement salt")
	}
	if _, _, err := net.SplitHostPort(t.ApiServerEndpoint); err != nil {
		bad("API server endpoint %s is not host:port", untrusted.Quote(t.ApiServerEndpoint))
	}
	for _, f := range t.ControlPlaneFiles {
		if !slices.Contains(controlPlaneFiles, f.Name) {
			bad("control-plane file %s is not one of %v", untrusted.Quote(f.Name), controlPlaneFiles)
		}
	}
	if self.Role != metadata.ControlPlane && len(t.ControlPlaneFiles) > 0 {
		bad("worker ticket carries control-plane files")
	}
	if _, err := registries.Parse(t.RegistryMirrors); err != nil {
		problems = append(problems, err)
	}
	return errors.Join(problems...)
}

// writeRegistryMirrors writes a ticket's registry mirrors (checked with the ticket) for the
// node's containerd.
func (c *Client) writeRegistryMirrors(data []byte) error {
	if c.cfg.RegistryHostsDir == "" {
		return nil
	}
	m, err := registries.Parse(data)
	if err != nil {
		return err
	}
	return registries.Write(c.cfg.RegistryHostsDir, m)
}

// checkTicketCerts checks that both kubelet certificates are signed by the ticket's cluster
// CA, for this node's keys and name, each for its one purpose.
func checkTicketCerts(t *joinpb.IssueJoinTicketResponse, self metadata.Instance, servingPub, clientPub crypto.PublicKey) error {
	ca, err := pki.ParseCert(t.ClusterCaCert)
	if err != nil {
		return fmt.Errorf("cluster CA: %w", err)
	}
	var problems []error
	if err := checkCert(t.KubeletCert, ca, self.Name, servingPub, x509.ExtKeyUsageServerAuth); err != nil {
		problems = append(problems, fmt.Errorf("kubelet serving certificate: %w", err))
	}
	if err := checkClientCert(t.KubeletClientCert, ca, self.Name, clientPub); err != nil {
		problems = append(problems, err)
	}
	return errors.Join(problems...)
}

// checkClientCert checks a kubelet client certificate (PEM) like checkCert. A nil ca skips
// the signature check: a rejoin ticket carries no CA.
func checkClientCert(certPEM []byte, ca *x509.Certificate, name string, pub crypto.PublicKey) error {
	if err := checkCert(certPEM, ca, name, pub, x509.ExtKeyUsageClientAuth); err != nil {
		return fmt.Errorf("kubelet client certificate: %w", err)
	}
	return nil
}

// checkCert checks that certPEM is for usage (and signed by ca, unless nil), for key pub, and
// names the node.
func checkCert(certPEM []byte, ca *x509.Certificate, name string, pub crypto.PublicKey, usage x509.ExtKeyUsage) error {
	cert, err := pki.ParseCert(certPEM)
	if err != nil {
		return err
	}
	var problems []error
	bad := func(format string, args ...any) { problems = append(problems, fmt.Errorf(format, args...)) }
	if ca != nil {
		pool := x509.NewCertPool()
		pool.AddCert(ca)
		if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
			bad("not signed by the cluster CA for this use: %w", err)
		}
	} else if !slices.Equal(cert.ExtKeyUsage, []x509.ExtKeyUsage{usage}) {
		bad("extended key usages %v, want only %v", cert.ExtKeyUsage, usage)
	}
	if p, ok := cert.PublicKey.(interface{ Equal(crypto.PublicKey) bool }); !ok || !p.Equal(pub) {
		bad("not for this node's key")
	}
	if want := kubeletcsr.NodeUserPrefix + name; cert.Subject.CommonName != want {
		bad("for %s, not %s", untrusted.Quote(cert.Subject.CommonName), want)
	}
	return errors.Join(problems...)
}

// writeDiscoveryFile writes the kubeconfig kubeadm joins with: the ticket's API server and
// CA, and the node's client certificate and key.
func (c *Client) writeDiscoveryFile(t *joinpb.IssueJoinTicketResponse, name string, clientKey crypto.Signer) error {
	keyPEM, err := pki.EncodeKey(clientKey)
	if err != nil {
		return err
	}
	data, err := kubeletcred.Kubeconfig(kubeletcred.KubeconfigParams{
		Server: t.ApiServerEndpoint, NodeName: name,
		CACert: t.ClusterCaCert, ClientCert: t.KubeletClientCert, ClientKey: keyPEM,
	})
	if err != nil {
		return fmt.Errorf("the join's discovery kubeconfig: %w", err)
	}
	return fileutil.WriteAtomic(c.cfg.DiscoveryFile, data, 0o600)
}

// writePKI writes what the ticket brings: the cluster CA (and, for control-plane nodes, the
// shared CA keys) into the PKI directory, and the kubelet's serving certificate and key.
func (c *Client) writePKI(t *joinpb.IssueJoinTicketResponse, servingKey crypto.Signer) error {
	files := map[string][]byte{pki.CACert: t.ClusterCaCert}
	for _, f := range t.ControlPlaneFiles {
		if f.Name == pki.CACert && !bytes.Equal(f.Data, t.ClusterCaCert) {
			return errors.New("ticket carries two different cluster CA certificates")
		}
		files[f.Name] = f.Data
	}
	for name, data := range files {
		if err := pki.WriteFile(c.cfg.PKIDir, name, data); err != nil {
			return err
		}
	}
	keyPEM, err := pki.EncodeKey(servingKey)
	if err != nil {
		return err
	}
	if err := pki.WriteFile(c.cfg.KubeletPKIDir, KubeletKeyFile, keyPEM); err != nil {
		return err
	}
	return pki.WriteFile(c.cfg.KubeletPKIDir, KubeletCertFile, t.KubeletCert)
}
