package joinclient

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"

	"github.com/openconstellation/constellation/api/join/joinpb"
	"github.com/openconstellation/constellation/internal/csidriver"
	"github.com/openconstellation/constellation/internal/joinservice"
	"github.com/openconstellation/constellation/internal/kms"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/pkg/atls"
)

// VolumeKeysConfig configures VolumeKeys.
type VolumeKeysConfig struct {
	// Metadata lists the join services (JoinEndpoints), as for a join.
	Metadata metadata.Provider
	// Dial connects over the mutually attested channel: AttestedDialer with the node's issuer
	// and its check of the service (joinservice.ServiceCheck), the join client's own.
	Dial Dialer
	// ClusterID is the cluster this node joined. A service is believed only when its node is
	// initialized for it (joinservice.CheckCluster): a join service of another cluster of the
	// same image passes the attested check, and a key from it would lock a new volume with a
	// key that cluster knows.
	ClusterID []byte
	// Clock, PollInterval, Backoff and AttemptTimeout as in Config (defaults alike).
	Clock          clock.Clock
	PollInterval   time.Duration
	Backoff        func() wait.Backoff
	AttemptTimeout time.Duration
	Log            *slog.Logger
}

// VolumeKeys asks the join service for encrypted volumes' keys: the node side of
// IssueVolumeKey (docs/joinservice.md, "Volume keys"). It implements csidriver.KeySource.
type VolumeKeys struct{ cfg VolumeKeysConfig }

var _ csidriver.KeySource = (*VolumeKeys)(nil)

// NewVolumeKeys checks cfg and returns the key source.
func NewVolumeKeys(cfg VolumeKeysConfig) (*VolumeKeys, error) {
	switch {
	case cfg.Metadata == nil || cfg.Dial == nil:
		return nil, errors.New("volume keys: metadata and dialer are required")
	case len(cfg.ClusterID) == 0:
		return nil, errors.New("volume keys: the node's cluster ID is required (the service is checked against it)")
	}
	scheduleDefaults(&cfg.Clock, &cfg.PollInterval, &cfg.Backoff, &cfg.AttemptTimeout, &cfg.Log)
	return &VolumeKeys{cfg: cfg}, nil
}

// RefusedError is the join service's definitive refusal of a volume key: the node is not
// entitled to it (yet), and asking again at once changes nothing. The kubelet retries the
// volume's staging on its own schedule.
type RefusedError struct {
	ID string
	// Code is the gRPC code (PermissionDenied, InvalidArgument).
	Code codes.Code
	// Reason is the service's message, naming why (volume-not-attached, ...).
	Reason string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("the join service refused the key of volume %s (%s): %s", e.ID, e.Code, e.Reason)
}

// Is makes a refusal csidriver.ErrKeyRefused: the driver answers the kubelet PermissionDenied.
func (e *RefusedError) Is(target error) bool { return target == csidriver.ErrKeyRefused }

// VolumeKey implements csidriver.KeySource. It tries every join service metadata lists, on
// the join client's schedule (polling while none answers, backing off once one refused for
// a transient reason: Unavailable, a failed handshake), until one releases the key or ctx
// ends. A definitive refusal (PermissionDenied, InvalidArgument) is returned at once as a
// *RefusedError.
func (v *VolumeKeys) VolumeKey(ctx context.Context, id string) ([]byte, error) {
	if !csidriver.ValidID(id) {
		// The service refuses it too; asking would only cost it a handshake.
		_, err := kms.VolumeKeyID(id)
		return nil, err
	}
	log := v.cfg.Log.With("volume", id)
	var key []byte
	var last error
	schedule := NewSchedule(v.cfg.PollInterval, v.cfg.Backoff)
	err := Retry(ctx, v.cfg.Clock, schedule, log, func(ctx context.Context) error {
		endpoints, err := v.cfg.Metadata.JoinEndpoints(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			last = fmt.Errorf("listing join endpoints: %w", err)
			return &AttemptError{Kind: Unreachable, Err: last}
		}
		if len(endpoints) == 0 {
			last = errNoEndpoints
			return &AttemptError{Kind: Unreachable, Err: last}
		}
		kind := Unreachable
		var failures []error
		for _, ep := range endpoints {
			failed := attempt(ctx, v.cfg.Dial, ep, v.cfg.AttemptTimeout, func(ctx context.Context, client joinpb.JoinServiceClient, _ func(_, _ []byte) error, opts ...grpc.CallOption) error {
				var p peer.Peer
				resp, err := client.IssueVolumeKey(ctx, &joinpb.IssueVolumeKeyRequest{VolumeId: id}, append(opts, grpc.Peer(&p))...)
				if err != nil {
					return err
				}
				info, ok := p.AuthInfo.(atls.AuthInfo)
				if !ok || info.Peer == nil {
					return errors.New("the join service's connection is not attested")
				}
				if err := joinservice.CheckCluster(info.Peer, v.cfg.ClusterID); err != nil {
					return err
				}
				if len(resp.Key) != kms.DerivedKeySize {
					return fmt.Errorf("volume key has %d bytes, want %d", len(resp.Key), kms.DerivedKeySize)
				}
				key = resp.Key
				return nil
			})
			if failed == nil {
				return nil
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if refused := definitive(id, failed.Err); refused != nil {
				log.Warn("volume key refused", "endpoint", ep, "code", refused.Code.String(), "reason", refused.Reason)
				return refused
			}
			if failed.Kind == Refused {
				kind = Refused
			}
			failures = append(failures, fmt.Errorf("%s: %w", ep, failed.Err))
		}
		last = errors.Join(failures...)
		return &AttemptError{Kind: kind, Err: last}
	})
	if err == nil {
		return key, nil
	}
	var refused *RefusedError
	if errors.As(err, &refused) || last == nil {
		return nil, err
	}
	return nil, fmt.Errorf("volume %s: no key before the deadline: %w (last attempt: %v)", id, err, last)
}

// definitive returns the refusal err is when no retry can change it: the service decided
// the node is not entitled to the key, or the request is malformed. Unavailable (the key
// service or the API server is down, or no connection) and every other code are transient.
func definitive(id string, err error) *RefusedError {
	st, ok := status.FromError(err)
	if !ok {
		return nil
	}
	switch st.Code() {
	case codes.PermissionDenied, codes.InvalidArgument:
		return &RefusedError{ID: id, Code: st.Code(), Reason: st.Message()}
	}
	return nil
}
