// Package recovery is the CLI side of `constellation recover`: after a full-cluster shutdown
// no join service runs, so the operator, who holds the master secret, hands each rebooted
// control plane the keys it needs to re-enter its cluster (the node side:
// internal/bootstrapper/recoveryserver).
//
// What a node gets is exactly what a rejoin ticket would have given it: the key of its own
// state disk and the measurement secret and salt. The master secret never leaves the CLI.
// Before any key is sent, the node must have shown, on the attested channel the keys travel
// over (pkg/atls, the node attesting, purpose atls-server):
//
//   - evidence that Validator accepts: the cluster's image, an AK certified by the platform;
//   - an AK certified for ExpectedNode, the node the operator means (ErrWrongNode: a relay
//     or a wrong address), as a control plane (ErrNotControlPlane: workers rejoin by
//     themselves and have no recovery server);
//   - PCR 15 zero (waiting) or carrying this cluster's marker (a bootstrapper that restarted
//     after it had re-entered): another cluster's marker is ErrNotWaiting.
//
// These checks run inside the attested handshake, on every connection the client makes, so
// a reconnect between the two calls is checked again before the keys go out.
//
// Then the node names its disk (Hello), and the client derives and sends a key only for
// Config.Disk, the disk recorded as that node's (ErrWrongDisk for any other): a genuine,
// certified control plane of the image holding another node's disk (swapped, cloned, or its
// cleartext UUID rewritten) would otherwise get that disk's key. The join service applies the
// same rule to rejoin tickets (docs/joinservice.md, "Keys follow identity"); its records are
// down with the cluster, so the CLI keeps its own copy (internal/state, Node.Disk).
package recovery

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/openconstellation/constellation/api/recover/recoverpb"
	"github.com/openconstellation/constellation/internal/kms"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/retry"
	"github.com/openconstellation/constellation/internal/statedisk"
	"github.com/openconstellation/constellation/pkg/atls"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/untrusted"
	"github.com/openconstellation/constellation/pkg/untrusted/untrustedgrpc"
)

// MinAttemptInterval is how often a recovery server admits an attested handshake, and a
// Recover call, from one caller once its burst is spent (recoveryserver.DefaultHandshakeLimits
// and DefaultAttemptLimits: one per 5 s, burst 4). A client that attempts a node no more
// often than this never runs into the node's limits, which would otherwise refuse it and
// hide why its earlier attempts failed.
const MinAttemptInterval = 5 * time.Second

// MaxRetryAfter bounds the wait a node may ask for when it refuses for now.
const MaxRetryAfter = 2 * time.Minute

// DefaultTimeout bounds a recovery whose context has no deadline: two calls, and on the node
// a key check, an unlock and a kubelet restart.
const DefaultTimeout = 2 * time.Minute

// Why a recovery failed. Every error Recover returns after the configuration was accepted
// wraps one of them.
var (
	// ErrEvidence: the node's evidence was refused (another image, an AK not certified by
	// the platform, a forged quote); the error also wraps the attestation reason.
	ErrEvidence = errors.New("the node's evidence was refused")
	// ErrWrongNode: the evidence is genuine, but its AK is certified for another node than
	// the one asked about, or for none.
	ErrWrongNode = errors.New("evidence is not signed by the node asked about")
	// ErrNotControlPlane: the node's AK is certified for another role than control plane.
	ErrNotControlPlane = errors.New("the node is not certified as a control plane")
	// ErrNotWaiting: the node is not waiting for recovery: it says it is back in its cluster
	// already, or it is committed to another cluster, or no recovery server answers
	// (ErrUnreachable).
	ErrNotWaiting = errors.New("the node is not waiting for recovery")
	// ErrUnreachable: no recovery server answers (the node is still booting, is back in its
	// cluster, or is a worker). Retryable.
	ErrUnreachable = fmt.Errorf("%w: no recovery server answers", ErrNotWaiting)
	// ErrBusy: the node refused for now (its handshake or attempt limits). Retryable.
	ErrBusy = errors.New("the node refused for now")
	// ErrWrongKey: the node's state disk does not open with the key derived from this master
	// secret (a master secret of another cluster, or another disk in the node). The node
	// changed nothing.
	ErrWrongKey = errors.New("the node's state disk does not open with the derived disk key")
	// ErrWrongCluster: the master secret and measurement salt do not give the expected
	// cluster ID (checked before anything is sent), or the node reports another one.
	ErrWrongCluster = errors.New("cluster ID mismatch")
	// ErrWrongDisk: the node names a disk other than the one recorded as its own (checked
	// before any key is derived).
	ErrWrongDisk = errors.New("the node names a disk that is not recorded as its own")
)

// DiskError is ErrWrongDisk: the node named a disk other than its recorded one.
type DiskError struct {
	Endpoint string
	// Node is the node asked about; Named the disk it named (a lower-case UUID); Recorded
	// the disk recorded for it.
	Node, Named, Recorded string
}

func (e *DiskError) Error() string {
	return fmt.Sprintf("recover %s: %v: node %q names disk %s, but its recorded disk is %s; no key was derived, nothing was sent",
		e.Endpoint, ErrWrongDisk, e.Node, e.Named, e.Recorded)
}

// Unwrap makes errors.Is(err, ErrWrongDisk) hold.
func (e *DiskError) Unwrap() error { return ErrWrongDisk }

// Config is one recovery of one control-plane node.
type Config struct {
	// Endpoint is the node's recovery server (host:port).
	Endpoint string
	// Dial, when set, makes the TCP connection (a platform's forwarding); default net.Dialer.
	Dial func(ctx context.Context, addr string) (net.Conn, error)
	// Validator checks the node's evidence: the cluster's reference values and the
	// platform's AK roots (without roots no AK is tied to a node, and ErrWrongNode follows).
	Validator attestation.Validator
	// ExpectedNode is the node's name, as the platform certified its AK.
	ExpectedNode string
	// Disk is ExpectedNode's state disk (lower-case UUID), as recorded while the cluster ran:
	// the one disk whose key may be derived and sent. Required.
	Disk string
	// MasterSecret is the cluster's master secret (constellation-mastersecret.json); it
	// stays here, only keys derived from it are sent.
	MasterSecret kms.MasterSecret
	// MeasurementSalt and ClusterID are the cluster's, from the state file.
	MeasurementSalt []byte
	ClusterID       []byte
	// Timeout applies when ctx has no deadline (DefaultTimeout).
	Timeout time.Duration
	Log     *slog.Logger
}

// Recover hands the node at cfg.Endpoint its disk key and the measurement secret and salt,
// once its evidence passed every check (see the package documentation), and returns the
// cluster ID the node re-entered with (equal to cfg.ClusterID). In order:
//
//  1. the master secret and measurement salt must give the state file's cluster ID;
//  2. an attested connection that checks the node's evidence, name and cluster;
//  3. Hello: the node names its disk, which must be the disk recorded for it;
//  4. Recover: the disk's key and the measurement secret, and the node's cluster ID back.
func Recover(ctx context.Context, cfg Config) ([]byte, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("node", cfg.ExpectedNode, "endpoint", cfg.Endpoint)
	measurementSecret, clusterID, err := cfg.clusterKeys()
	if err != nil {
		return nil, err
	}
	if _, ok := ctx.Deadline(); !ok {
		timeout := cfg.Timeout
		if timeout <= 0 {
			timeout = DefaultTimeout
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	client, creds, closeConn, err := cfg.dial(clusterID)
	if err != nil {
		return nil, err
	}
	defer closeConn()
	diskUUID, err := cfg.recordedDisk(ctx, client, creds)
	if err != nil {
		return nil, err
	}
	diskKey, err := cfg.MasterSecret.StateDiskKey(cfg.Disk)
	if err != nil {
		return nil, err
	}
	log.Info("node verified: sending its disk key and the measurement secret", "disk", diskUUID)
	resp, err := client.Recover(ctx, &recoverpb.RecoverRequest{
		StateDiskKey: diskKey, MeasurementSecret: measurementSecret, MeasurementSalt: cfg.MeasurementSalt,
	})
	if err != nil {
		return nil, cfg.callError("recovering the node", creds, err)
	}
	if !bytes.Equal(resp.GetClusterId(), clusterID) {
		return nil, fmt.Errorf("recover %s: %w: the node reports cluster ID %s, expected %x", cfg.Endpoint, ErrWrongCluster, untrusted.Quote(hex.EncodeToString(resp.GetClusterId())), clusterID)
	}
	log.Info("node recovered", "clusterID", hex.EncodeToString(clusterID))
	return clusterID, nil
}

// clusterKeys derives the measurement secret and the cluster ID, which must be the state
// file's: otherwise the master secret and the salt belong to different clusters.
func (cfg Config) clusterKeys() (measurementSecret, clusterID []byte, err error) {
	measurementSecret, err = cfg.MasterSecret.MeasurementSecret()
	if err != nil {
		return nil, nil, err
	}
	clusterID, err = kms.ClusterID(measurementSecret, cfg.MeasurementSalt)
	if err != nil {
		return nil, nil, err
	}
	if !bytes.Equal(clusterID, cfg.ClusterID) {
		return nil, nil, fmt.Errorf("recover: %w: the master secret and measurement salt give cluster ID %x, the state file names %x: they belong to different clusters; nothing was sent",
			ErrWrongCluster, clusterID, cfg.ClusterID)
	}
	return measurementSecret, clusterID, nil
}

// dial returns a client of the node's recovery server over attested TLS, whose handshake
// checks the node's evidence, that it is cfg.ExpectedNode, and its cluster.
func (cfg Config) dial(clusterID []byte) (recoverpb.RecoverServiceClient, *atls.RecordingCredentials, func(), error) {
	check := nodeCheck{Validator: cfg.Validator, node: cfg.ExpectedNode, clusterID: clusterID}
	atlsCreds, err := atls.NewCredentials(atls.Config{Validators: []attestation.Validator{check}})
	if err != nil {
		return nil, nil, nil, err
	}
	creds := atlsCreds.Recording()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if cfg.Dial != nil {
		opts = append(opts, grpc.WithContextDialer(cfg.Dial))
	}
	conn, err := grpc.NewClient("passthrough:///"+cfg.Endpoint, opts...)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("recover %s: %w", cfg.Endpoint, err)
	}
	return recoverpb.NewRecoverServiceClient(conn), creds, func() { conn.Close() }, nil
}

// recordedDisk asks the node which disk it waits with over the attested connection, and
// returns it if it is the disk recorded for the node.
func (cfg Config) recordedDisk(ctx context.Context, client recoverpb.RecoverServiceClient, creds *atls.RecordingCredentials) (string, error) {
	var p peer.Peer
	hello, err := client.Hello(ctx, &recoverpb.HelloRequest{}, grpc.Peer(&p))
	if err != nil {
		return "", cfg.callError("asking for the node's disk", creds, err)
	}
	// Fail closed should the connection not be the checked one.
	if info, ok := p.AuthInfo.(atls.AuthInfo); !ok || info.Peer == nil {
		return "", fmt.Errorf("recover %s: %w: the connection is not attested", cfg.Endpoint, ErrEvidence)
	}
	diskUUID := hello.GetDiskUuid()
	if !statedisk.ValidUUID(diskUUID) {
		return "", fmt.Errorf("recover %s: the node names its disk %s, not a lower-case UUID; nothing was sent", cfg.Endpoint, untrusted.Quote(diskUUID))
	}
	// Keys follow identity: only the key of the disk recorded for this node, never the key
	// of whatever disk it names.
	if diskUUID != cfg.Disk {
		return "", &DiskError{Endpoint: cfg.Endpoint, Node: cfg.ExpectedNode, Named: diskUUID, Recorded: cfg.Disk}
	}
	return diskUUID, nil
}

// Retryable reports whether a recovery that failed with err may succeed later without
// anything changing on the operator's side: the node was not up yet, or refused for now.
// Security failures (ErrEvidence, ErrWrongNode, ErrNotControlPlane, ErrWrongCluster,
// ErrWrongDisk, ErrWrongKey) and a node that is not waiting are not.
func Retryable(err error) bool {
	return errors.Is(err, ErrUnreachable) || errors.Is(err, ErrBusy)
}

func (cfg Config) validate() error {
	var problems []error
	if cfg.Endpoint == "" {
		problems = append(problems, errors.New("no endpoint"))
	}
	if cfg.Validator == nil {
		problems = append(problems, errors.New("no validator for the node's evidence"))
	}
	if cfg.ExpectedNode == "" {
		problems = append(problems, errors.New("no node name to tie the evidence to"))
	}
	switch {
	case cfg.Disk == "":
		problems = append(problems, fmt.Errorf("no disk recorded for node %q: it would get the key of whatever disk it names", cfg.ExpectedNode))
	case !statedisk.ValidUUID(cfg.Disk):
		problems = append(problems, fmt.Errorf("the disk recorded for node %q, %s, is not a lower-case UUID", cfg.ExpectedNode, untrusted.Quote(cfg.Disk)))
	}
	if err := cfg.MasterSecret.Validate(); err != nil {
		problems = append(problems, err)
	}
	if len(cfg.MeasurementSalt) != 32 {
		problems = append(problems, fmt.Errorf("measurement salt has %d bytes, want 32", len(cfg.MeasurementSalt)))
	}
	if len(cfg.ClusterID) != 32 {
		problems = append(problems, fmt.Errorf("cluster ID has %d bytes, want 32", len(cfg.ClusterID)))
	}
	if len(problems) > 0 {
		return fmt.Errorf("recover: %w", errors.Join(problems...))
	}
	return nil
}

// callError names why a call failed: the attested handshake's failure if there was one (the
// node check's refusal among them), otherwise the node's answer.
func (cfg Config) callError(what string, creds *atls.RecordingCredentials, err error) error {
	if hsErr := creds.LastError(); hsErr != nil {
		// The client does not attest, so the node aborts a handshake only when its limits
		// refuse it.
		var aErr *atls.Error
		if errors.As(hsErr, &aErr) && !aErr.Local {
			return fmt.Errorf("recover %s: %s: %w: %w; nothing was sent", cfg.Endpoint, what, ErrBusy, hsErr)
		}
		// The connection itself failed under the handshake (reset, closed, timed out): the
		// node's recovery server stopped while it answered (the node rejoined at that moment)
		// or the network failed. No recovery server answered; the next attempt tells which.
		// An attestation refusal of ours is no network error, and stays final.
		if errors.As(hsErr, &aErr) && aErr.Reason == "protocol" && retry.Transient(hsErr) {
			return fmt.Errorf("recover %s: %s: %w (the connection failed during the attested handshake): %w; nothing was sent", cfg.Endpoint, what, ErrUnreachable, hsErr)
		}
		return fmt.Errorf("recover %s: %s: %w; nothing was sent", cfg.Endpoint, what, hsErr)
	}
	// The status is the node's: its message is the node's text, made one bounded line.
	orig := err
	err = untrustedgrpc.Status(err)
	st := status.Convert(err)
	switch st.Code() {
	case codes.PermissionDenied:
		return fmt.Errorf("recover %s: %w: %s", cfg.Endpoint, ErrWrongKey, st.Message())
	case codes.FailedPrecondition:
		return fmt.Errorf("recover %s: %w: %s", cfg.Endpoint, ErrNotWaiting, st.Message())
	case codes.ResourceExhausted:
		busy := fmt.Errorf("recover %s: %s: %w: %s", cfg.Endpoint, what, ErrBusy, st.Message())
		// A node that says when to come back is taken at its word (retry.After), within
		// MaxRetryAfter: the delay is the node's to say, not to inflate.
		if d, ok := retry.After(orig); ok {
			return retry.WithDelay(busy, min(d, MaxRetryAfter))
		}
		return busy
	case codes.Unavailable:
		return fmt.Errorf("recover %s: %w (a node still booting, back in its cluster, or a worker): %w", cfg.Endpoint, ErrUnreachable, err)
	}
	return fmt.Errorf("recover %s: %s: %w", cfg.Endpoint, what, err)
}

// nodeCheck is the validator the client's attested handshakes run: cfg.Validator's checks,
// then the node's identity, role and state.
type nodeCheck struct {
	attestation.Validator
	node      string
	clusterID []byte
}

func (c nodeCheck) Validate(ctx context.Context, evidence []byte, purpose attestation.Purpose, data []byte) (*attestation.Verified, error) {
	verified, err := c.Validator.Validate(ctx, evidence, purpose, data)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrEvidence, err)
	}
	if !verified.SignerCertified {
		return nil, fmt.Errorf("%w: the signing key carries no platform certificate, so nothing ties the evidence to node %q", ErrWrongNode, c.node)
	}
	if verified.SignerName != c.node {
		return nil, fmt.Errorf("%w: evidence signed by a key the platform certified for %s, not %q (a relay, or a wrong address)", ErrWrongNode, untrusted.Quote(verified.SignerName), c.node)
	}
	if verified.SignerRole != metadata.ControlPlane {
		return nil, fmt.Errorf("%w: node %q is certified as %s", ErrNotControlPlane, c.node, untrusted.Quote(string(verified.SignerRole)))
	}
	// The variant says which register carries the cluster-ID marker.
	reg, ok := verified.Variant.ClusterIDRegister()
	if !ok {
		return nil, fmt.Errorf("%w: the evidence names no variant", ErrEvidence)
	}
	marker, ok := verified.Registers[reg]
	if !ok {
		return nil, fmt.Errorf("%w: the evidence does not cover %s", ErrEvidence, verified.Variant.RegisterName(reg))
	}
	if !bytes.Equal(marker, make([]byte, len(marker))) && !bytes.Equal(marker, verified.Variant.ClusterIDMarker(c.clusterID)) {
		return nil, fmt.Errorf("%w: node %q is committed to another cluster in this boot (%s is %x)", ErrNotWaiting, c.node, verified.Variant.RegisterName(reg), marker)
	}
	return verified, nil
}
