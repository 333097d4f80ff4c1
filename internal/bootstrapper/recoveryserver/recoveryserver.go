// Package recoveryserver is the node side of `constellation recover`: the server a rebooted
// control-plane node runs, next to its rejoin client, until it is back in its cluster.
//
// After a full-cluster shutdown every node reboots and asks a join service for a rejoin
// ticket, but the join services run on the control planes, which are waiting themselves.
// The operator's CLI holds the master secret; it connects to each control plane over the
// attested channel with the node attesting (the CLI verifies the node's image and that its
// AK is certified for the node it means, as a control plane, before it sends anything), asks
// for the node's disk UUID (Hello) and sends exactly the keys that node needs (Recover): the
// key of its own state disk and the measurement secret and salt. Never the master secret.
// Once enough control planes are back for etcd quorum the join services run again, and the
// other nodes rejoin by themselves.
//
// Whoever reaches the port is unauthenticated until it shows the disk key, so:
//
//   - attested handshakes (a TPM quote each) pass a per-caller rate and concurrency limit
//     first (DefaultHandshakeLimits), as the init server's do;
//   - Recover calls pass a per-caller limit too (DefaultAttemptLimits): each wrong key costs
//     the node a key check (a KDF run) and is a guess;
//   - the disk key is checked against the state storage before anything changes
//     (node.ReenterAs, statedisk.Storage.CheckKey): a wrong key, with any measurement
//     secret, is PermissionDenied and leaves PCR 15 zero, the storage locked and the node
//     waiting. The disk key is a 256-bit HKDF output, so guessing it is hopeless; the caller
//     that has it could read the disk anyway.
//
// Only then does the node take the node lock (holder "recover"; PCR 15 extended with the
// cluster ID the measurement secret and salt give), unlock its storage and restart the
// kubelet, exactly as the rejoin path does. The rejoin client races for the same lock:
// exactly one of them re-enters the node; the other stops. A Recover after that is
// FailedPrecondition and changes nothing.
package recoveryserver

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/openconstellation/constellation/api/recover/recoverpb"
	"github.com/openconstellation/constellation/internal/bootstrapper/node"
	"github.com/openconstellation/constellation/internal/bootstrapper/nodelock"
	"github.com/openconstellation/constellation/internal/handshakelimit"
	"github.com/openconstellation/constellation/internal/kms"
	"github.com/openconstellation/constellation/internal/statedisk"
	"github.com/openconstellation/constellation/pkg/atls"
	"github.com/openconstellation/constellation/pkg/attestation"
)

// MeasurementSaltSize is the size of the measurement salt (as the init request has it).
const MeasurementSaltSize = 32

// DefaultTimeout bounds the work after the node lock is taken (unlock, kubelet restart).
const DefaultTimeout = 5 * time.Minute

// DefaultAcceptLimits bound the connections whose attested handshake has not finished (step
// 0, before TLS: docs/atls.md): the CLI opens one at a time; the deadline is aTLS's.
var DefaultAcceptLimits = handshakelimit.AcceptLimits{PerPeer: 4, Total: 32, Timeout: atls.DefaultHandshakeTimeout}

// DefaultHandshakeLimits admit the attested handshakes of anonymous callers, each of which
// makes the node quote: the CLI needs one per recovery, and a retry now and then.
var DefaultHandshakeLimits = handshakelimit.Limits{
	Rate: rate.Every(5 * time.Second), Burst: 4, PerPeer: 2, Concurrent: 2, Waiting: 4,
	What: "attested handshakes",
}

// DefaultAttemptLimits admit Recover calls before the disk key is checked (a KDF run and a
// guess each). One connection carries any number of calls, so they are limited apart from
// the handshakes. One recovery works at a time; a second waits for it and then finds the
// node back in its cluster.
var DefaultAttemptLimits = handshakelimit.Limits{
	Rate: rate.Every(5 * time.Second), Burst: 4, PerPeer: 1, Concurrent: 1, Waiting: 4,
	What: "recovery attempts",
}

// Config configures the recovery server.
type Config struct {
	// Node is the node's lock and state storage, opened in the rebooted state.
	Node *node.Node
	// Issuer attests the node to the CLI.
	Issuer attestation.Issuer
	// Kubelet is restarted once the storage is unlocked.
	Kubelet node.Kubelet
	// RenewKubeletCredential gives the kubelet a fresh client certificate before it restarts
	// (the node was off, maybe longer than its certificate lives, and no join service runs to
	// issue one): a control plane signs its own with its CA (kubeletcred.RenewWithCA).
	RenewKubeletCredential func() error
	// Timeout bounds the work after the node lock is taken (DefaultTimeout).
	Timeout time.Duration
	// AcceptLimits bound connections whose attested handshake has not finished, from the
	// moment they are accepted; their Timeout is the handshake deadline. Unset limits: those
	// of DefaultAcceptLimits.
	AcceptLimits handshakelimit.AcceptLimits
	// HandshakeLimits admit attested handshakes before the node quotes; AttemptLimits admit
	// Recover calls before the disk key is checked. Unset limits: those of
	// DefaultHandshakeLimits, DefaultAttemptLimits.
	HandshakeLimits, AttemptLimits handshakelimit.Limits
	// Now is the limiters' clock (time.Now when nil).
	Now func() time.Time
	// Log receives the server's structured log.
	Log *slog.Logger
}

// Server is the recovery server.
type Server struct {
	recoverpb.UnimplementedRecoverServiceServer
	cfg      Config
	serving  *handshakelimit.AttestingServer
	attempts *handshakelimit.Limiter

	running       sync.Mutex // one Recover at a time
	committed     chan struct{}
	committedOnce sync.Once
	finished      chan struct{}
	err           error // of the Recover that took the node lock, once finished is closed
}

// New checks cfg and returns a server. The node must be in the rebooted state: a fresh
// node has nothing to recover.
func New(cfg Config) (*Server, error) {
	var missing []string
	if cfg.Node == nil {
		missing = append(missing, "Node")
	}
	if cfg.Issuer == nil {
		missing = append(missing, "Issuer")
	}
	if cfg.Kubelet == nil {
		missing = append(missing, "Kubelet")
	}
	if cfg.RenewKubeletCredential == nil {
		missing = append(missing, "RenewKubeletCredential")
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("recovery server: missing %s", strings.Join(missing, ", "))
	}
	if cfg.Node.State() != node.Rebooted {
		return nil, fmt.Errorf("recovery server: node is %s, not rebooted: it has no cluster to recover into", cfg.Node.State())
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
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
		return nil, fmt.Errorf("recovery server: %w", err)
	}
	return &Server{
		cfg: cfg, serving: serving, attempts: serving.Attempts(),
		committed: make(chan struct{}), finished: make(chan struct{}),
	}, nil
}

// NewGRPCServer returns the gRPC server to serve s with: attested-channel credentials (the
// node attests), every connection bounded from the moment it is accepted (AcceptLimits), the
// service registered. opts are added (tests record calls).
func (s *Server) NewGRPCServer(opts ...grpc.ServerOption) *handshakelimit.GRPCServer {
	g := s.serving.NewGRPCServer(opts...)
	recoverpb.RegisterRecoverServiceServer(g, s)
	return g
}

// AcceptLimiter bounds the connections whose handshake has not finished.
func (s *Server) AcceptLimiter() *handshakelimit.AcceptLimiter { return s.serving.AcceptLimiter() }

// Committed is closed once a Recover has taken the node lock: the rejoin client can stop.
func (s *Server) Committed() <-chan struct{} { return s.committed }

// Finished is closed when a Recover that took the node lock has ended; Err then tells how.
func (s *Server) Finished() <-chan struct{} { return s.finished }

// Err is the result of the Recover that took the node lock (valid once Finished is closed).
func (s *Server) Err() error {
	<-s.finished
	return s.err
}

// Hello names the node's state disk.
func (s *Server) Hello(context.Context, *recoverpb.HelloRequest) (*recoverpb.HelloResponse, error) {
	id, err := s.cfg.Node.DiskUUID()
	if err != nil {
		s.cfg.Log.Error("reading the state disk's UUID", "err", err)
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	return &recoverpb.HelloResponse{DiskUuid: id}, nil
}

// retryLater is the ResourceExhausted status of a refusal by limits, telling the caller
// (RetryInfo) to come back no sooner than one attempt's token refills: a client that retries
// faster only meets the refusal again.
func retryLater(err error, limits handshakelimit.Limits) error {
	st := status.New(codes.ResourceExhausted, err.Error())
	if limits.Rate > 0 && limits.Rate != rate.Inf {
		refill := time.Duration(float64(time.Second) / float64(limits.Rate))
		if withInfo, derr := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(refill)}); derr == nil {
			st = withInfo
		}
	}
	return st.Err()
}

// Recover re-enters the node into its cluster (see the package documentation).
func (s *Server) Recover(ctx context.Context, req *recoverpb.RecoverRequest) (*recoverpb.RecoverResponse, error) {
	var remote net.Addr
	if p, ok := peer.FromContext(ctx); ok {
		remote = p.Addr
	}
	log := s.cfg.Log.With("method", "Recover", "peer", handshakelimit.AddrOf(remote).String())
	release, err := s.attempts.Admit(ctx, remote)
	if err != nil {
		// Not logged as a warning: a flood would flood the log; the caller is told.
		log.Debug("recovery refused", "reason", handshakelimit.Reason(err), "err", err)
		return nil, retryLater(err, s.attempts.Limits())
	}
	defer release()
	if err := CheckRequest(req); err != nil {
		return nil, refuse(log, codes.InvalidArgument, "invalid-request", "%v", err)
	}
	if !s.running.TryLock() {
		return nil, refuse(log, codes.FailedPrecondition, "recovery-running", "a recovery is already running on this node")
	}
	defer s.running.Unlock()
	select {
	case <-s.cfg.Node.Claimed():
		return nil, refuse(log, codes.FailedPrecondition, "node-back", "this node is back in its cluster (node lock taken by %s): recovery changes nothing", s.cfg.Node.LockHolder())
	default:
	}
	clusterID, err := kms.ClusterID(req.MeasurementSecret, req.MeasurementSalt)
	if err != nil {
		return nil, refuse(log, codes.InvalidArgument, "invalid-request", "%v", err)
	}

	// Past the lock, the node finishes what it started even if the caller goes away.
	work, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.Timeout)
	defer cancel()
	err = s.cfg.Node.ReenterAs(work, node.HolderRecover, clusterID, req.StateDiskKey)
	switch {
	case errors.Is(err, statedisk.ErrWrongKey):
		return nil, refuse(log, codes.PermissionDenied, "wrong-key", "wrong disk key: the state storage does not open with it; nothing changed")
	case errors.Is(err, nodelock.ErrLocked):
		return nil, refuse(log, codes.FailedPrecondition, "node-back", "this node is back in its cluster: %v; recovery changes nothing", err)
	case errors.Is(err, nodelock.ErrOtherCluster):
		return nil, refuse(log, codes.FailedPrecondition, "other-cluster", "this node was committed to another cluster earlier in this boot: %v; recovery changes nothing", err)
	case err != nil && !strings.HasPrefix(s.cfg.Node.LockHolder(), node.HolderRecover):
		log.Error("recovery failed before the node lock", "err", err)
		return nil, status.Errorf(codes.Internal, "recovery failed, node unchanged: %v", err)
	case err != nil:
		s.commit()
		log.Error("recovery failed after the node lock was taken", "err", err)
		s.finish(err)
		return nil, status.Errorf(codes.Internal, "recovery failed after PCR 15 was extended (the node needs a reboot): %v", err)
	}
	s.commit()
	if err := s.cfg.RenewKubeletCredential(); err != nil {
		err = fmt.Errorf("renewing the kubelet's client certificate: %w", err)
		log.Error("recovery failed", "err", err)
		s.finish(err)
		return nil, status.Errorf(codes.Internal, "recovery failed: %v", err)
	}
	log.Info("node lock taken, PCR 15 extended, state storage unlocked, kubelet client certificate renewed; restarting the kubelet", "clusterID", hex.EncodeToString(clusterID))
	if err := s.cfg.Kubelet.Restart(work); err != nil {
		err = fmt.Errorf("restarting the kubelet: %w", err)
		log.Error("recovery failed", "err", err)
		s.finish(err)
		return nil, status.Errorf(codes.Internal, "recovery failed: %v", err)
	}
	log.Info("node recovered into its cluster", "clusterID", hex.EncodeToString(clusterID))
	s.finish(nil)
	return &recoverpb.RecoverResponse{ClusterId: clusterID}, nil
}

// CheckRequest checks the sizes of a Recover request, naming every problem.
func CheckRequest(req *recoverpb.RecoverRequest) error {
	var problems []error
	for _, f := range []struct {
		name string
		got  int
		want int
	}{
		{"state disk key", len(req.GetStateDiskKey()), statedisk.KeySize},
		{"measurement secret", len(req.GetMeasurementSecret()), kms.DerivedKeySize},
		{"measurement salt", len(req.GetMeasurementSalt()), MeasurementSaltSize},
	} {
		if f.got != f.want {
			problems = append(problems, fmt.Errorf("%s has %d bytes, want %d", f.name, f.got, f.want))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("invalid recovery request: %w", errors.Join(problems...))
	}
	return nil
}

func (s *Server) commit() { s.committedOnce.Do(func() { close(s.committed) }) }

func (s *Server) finish(err error) {
	s.err = err
	close(s.finished)
}

func refuse(log *slog.Logger, code codes.Code, reason, format string, args ...any) error {
	err := status.Errorf(code, format, args...)
	log.Warn("recovery refused", "reason", reason, "err", status.Convert(err).Message())
	return err
}
