package joinservice

import (
	"context"

	"google.golang.org/grpc/codes"

	"github.com/openconstellation/constellation/api/join/joinpb"
	"github.com/openconstellation/constellation/internal/csidriver"
	"github.com/openconstellation/constellation/internal/kms"
	"github.com/openconstellation/constellation/pkg/untrusted"
)

// methodVolumeKey is IssueVolumeKey's stage label in logs and metrics.
const methodVolumeKey = "volume-key"

// IssueVolumeKey releases an encrypted volume's key to the node that has the volume attached
// and a pod using it (docs/joinservice.md, "Volume keys"). The key is a pure function of the
// master secret and the volume id, so without these checks any attested node could read any
// volume its pods do not use.
func (s *Service) IssueVolumeKey(ctx context.Context, req *joinpb.IssueVolumeKeyRequest) (*joinpb.IssueVolumeKeyResponse, error) {
	return decide(ctx, s, methodVolumeKey, func(a *admitted) (*joinpb.IssueVolumeKeyResponse, outcome, error) {
		return s.issueVolumeKey(ctx, a, req)
	})
}

// issueVolumeKey runs after admit (steps 0-3: attested, named by the platform, not removed):
//
//  1. parse: the volume id has csidriver.IDFor's form;
//  2. the measurements still match a reference set in force (recheck);
//  3. authorize, from the API server at this moment: the volume's PersistentVolume of this
//     driver exists, it is attached to this node, and a pod bound to this node that has not
//     terminated uses a claim bound to it;
//  4. only then the key service derives the key.
func (s *Service) issueVolumeKey(ctx context.Context, a *admitted, req *joinpb.IssueVolumeKeyRequest) (*joinpb.IssueVolumeKeyResponse, outcome, error) {
	id := req.GetVolumeId()
	keyID, err := kms.VolumeKeyID(id)
	if err != nil {
		return nil, outcome{}, deny(codes.InvalidArgument, "invalid-volume-id", "invalid-volume-id: volume id %s is not of the form vol-<32 lower-case hex digits>", untrusted.Quote(id))
	}
	set, err := s.recheck(a)
	if err != nil {
		return nil, outcome{}, err
	}
	pv, err := s.authorizeVolume(ctx, a.node.Name, id)
	if err != nil {
		return nil, outcome{}, err
	}
	key, err := s.cfg.Keys.DataKey(ctx, keyID, kms.DerivedKeySize)
	if err != nil {
		return nil, outcome{}, deny(codes.Unavailable, "key-service", "deriving the key of volume %s: %v", id, err)
	}
	return &joinpb.IssueVolumeKeyResponse{Key: key}, outcome{set: set, role: "any", logArgs: []any{"volume", id, "persistentVolume", pv}}, nil
}

// authorizeVolume says whether node may have volume id's key, and names the volume's
// PersistentVolume. The refusals do not say which node has the volume or uses it.
func (s *Service) authorizeVolume(ctx context.Context, node, id string) (string, error) {
	pv, err := s.volumes.PersistentVolume(ctx, id)
	if err != nil {
		return "", deny(codes.Unavailable, "kubernetes-api", "looking up volume %s: %v", id, err)
	}
	if pv == "" {
		return "", deny(codes.PermissionDenied, "volume-unknown", "volume-unknown: no PersistentVolume of driver %s has volume handle %s", csidriver.Name, id)
	}
	attached, err := s.volumes.AttachedTo(ctx, pv, node)
	if err != nil {
		return "", deny(codes.Unavailable, "kubernetes-api", "looking up the attachments of PersistentVolume %s: %v", pv, err)
	}
	if !attached {
		return "", deny(codes.PermissionDenied, "volume-not-attached", "volume-not-attached: volume %s (PersistentVolume %s) is not attached to node %q", id, pv, node)
	}
	used, err := s.volumes.UsedOn(ctx, pv, node)
	if err != nil {
		return "", deny(codes.Unavailable, "kubernetes-api", "looking up the pods of node %q: %v", node, err)
	}
	if !used {
		return "", deny(codes.PermissionDenied, "volume-not-used-by-node", "volume-not-used-by-node: no running pod bound to node %q uses volume %s (PersistentVolume %s)", node, id, pv)
	}
	return pv, nil
}
