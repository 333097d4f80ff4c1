package csidriver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const (
	mib = int64(1) << 20
	gib = int64(1) << 30
	// DefaultBytes is a volume's size when the request names none.
	DefaultBytes = 1 * gib
	// MinBytes is the smallest volume: ext4 with its journal and the gocryptfs tree's
	// metadata need a few MiB before a file fits. Smaller requests get MinBytes (CSI allows
	// more than required_bytes).
	MinBytes = 16 * mib
	// parameterPrefix is the prefix of the parameters the Kubernetes CSI sidecars add
	// themselves (e.g. csi.storage.k8s.io/pvc/name); every other parameter is refused.
	parameterPrefix = "csi.storage.k8s.io/"
)

// Controller is the CSI controller service (and the identity service beside it): it creates,
// attaches, detaches, expands and deletes volumes through the platform's Backing. It holds no
// state of its own; the platform is the one home of every volume.
type Controller struct {
	csi.UnimplementedControllerServer
	backing Backing
	log     *slog.Logger
}

// NewController returns the controller service over backing.
func NewController(backing Backing, log *slog.Logger) *Controller {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Controller{backing: backing, log: log}
}

// CreateVolume makes the volume named by the request (id IDFor(name)), of the requested
// capacity rounded up to whole MiB.
func (c *Controller) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "CreateVolume: name is missing")
	}
	if err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "CreateVolume %s: %v", req.GetName(), err)
	}
	if err := checkParameters(req.GetParameters()); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "CreateVolume %s: %v", req.GetName(), err)
	}
	if req.GetVolumeContentSource() != nil {
		return nil, status.Errorf(codes.InvalidArgument, "CreateVolume %s: a volume content source (snapshot or clone) is not supported", req.GetName())
	}
	bytes, err := capacity(req.GetCapacityRange())
	if err != nil {
		return nil, err
	}
	id := IDFor(req.GetName())
	vol, err := c.backing.Create(ctx, id, bytes)
	if errors.Is(err, ErrExists) {
		return nil, status.Errorf(codes.AlreadyExists, "CreateVolume %s: volume %s: %v", req.GetName(), id, err)
	}
	if err != nil {
		return nil, status.Errorf(codes.Internal, "CreateVolume %s: creating volume %s: %v", req.GetName(), id, err)
	}
	c.log.Info("volume created", "name", req.GetName(), "volume", id, "bytes", vol.Bytes)
	return &csi.CreateVolumeResponse{Volume: &csi.Volume{VolumeId: vol.ID, CapacityBytes: vol.Bytes}}, nil
}

// capacity is the size to create for r: required bytes rounded up to whole MiB (at least
// MinBytes), DefaultBytes when r asks for nothing, never more than the limit.
func capacity(r *csi.CapacityRange) (int64, error) {
	required, limit := r.GetRequiredBytes(), r.GetLimitBytes()
	if required < 0 || limit < 0 {
		return 0, status.Errorf(codes.InvalidArgument, "capacity range: negative bytes (required %d, limit %d)", required, limit)
	}
	if limit > 0 && limit < required {
		return 0, status.Errorf(codes.InvalidArgument, "capacity range: limit %d bytes is less than the required %d", limit, required)
	}
	var bytes int64
	switch {
	case required > 0:
		if required > (1<<62)-mib {
			return 0, status.Errorf(codes.OutOfRange, "capacity range: %d bytes is too large", required)
		}
		bytes = (required + mib - 1) / mib * mib
	case limit > 0:
		bytes = min(DefaultBytes, limit/mib*mib)
	default:
		bytes = DefaultBytes
	}
	bytes = max(bytes, MinBytes)
	if limit > 0 && bytes > limit {
		return 0, status.Errorf(codes.OutOfRange, "capacity range: the smallest volume that fits (%d bytes: whole MiB, at least %d) exceeds the limit %d", bytes, MinBytes, limit)
	}
	return bytes, nil
}

// checkParameters refuses StorageClass parameters the driver does not know: a setting the
// user wrote and the driver ignored would be a silent surprise.
func checkParameters(params map[string]string) error {
	for k := range params {
		if !strings.HasPrefix(k, parameterPrefix) {
			return fmt.Errorf("unknown parameter %q (the driver takes none)", k)
		}
	}
	return nil
}

// checkCapabilities accepts mount volumes that one node uses at a time.
func checkCapabilities(caps []*csi.VolumeCapability) error {
	if len(caps) == 0 {
		return errors.New("volume capabilities are missing")
	}
	for _, c := range caps {
		if err := checkCapability(c); err != nil {
			return err
		}
	}
	return nil
}

func checkCapability(c *csi.VolumeCapability) error {
	if c == nil {
		return errors.New("volume capability is missing")
	}
	switch c.GetAccessType().(type) {
	case *csi.VolumeCapability_Mount:
	case *csi.VolumeCapability_Block:
		return errors.New("access type block is not supported: volumes are file systems (access type mount)")
	default:
		return errors.New("access type is missing (mount is supported)")
	}
	if fs := c.GetMount().GetFsType(); fs != "" && fs != "ext4" {
		return fmt.Errorf("file system type %q is not supported (ext4 only)", fs)
	}
	if flags := c.GetMount().GetMountFlags(); len(flags) > 0 {
		return fmt.Errorf("mount flags %q are not supported", flags)
	}
	switch mode := c.GetAccessMode().GetMode(); mode {
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY:
		return nil
	case csi.VolumeCapability_AccessMode_UNKNOWN:
		return errors.New("access mode is missing")
	default:
		return fmt.Errorf("access mode %s is not supported: a volume is used by one node at a time", mode)
	}
}

// volumeID checks a request's volume id: missing is InvalidArgument; one of a form IDFor
// never gives names no volume, so it is NotFound (CSI: the volume does not exist).
func volumeID(method, id string) error {
	if id == "" {
		return status.Errorf(codes.InvalidArgument, "%s: volume id is missing", method)
	}
	if !ValidID(id) {
		return status.Errorf(codes.NotFound, "%s: volume %q: %v (not a volume id of this driver)", method, id, ErrNotFound)
	}
	return nil
}

// DeleteVolume removes the volume's storage. A volume that does not exist is deleted.
func (c *Controller) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "DeleteVolume: volume id is missing")
	}
	if !ValidID(id) {
		// No volume can have this id: it is deleted already.
		return &csi.DeleteVolumeResponse{}, nil
	}
	err := c.backing.Delete(ctx, id)
	switch {
	case errors.Is(err, ErrAttached):
		return nil, status.Errorf(codes.FailedPrecondition, "DeleteVolume %s: %v", id, err)
	case err != nil && !errors.Is(err, ErrNotFound):
		return nil, status.Errorf(codes.Internal, "DeleteVolume %s: %v", id, err)
	}
	c.log.Info("volume deleted", "volume", id)
	return &csi.DeleteVolumeResponse{}, nil
}

// ControllerPublishVolume attaches the volume to the node (one node at a time).
func (c *Controller) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	const method = "ControllerPublishVolume"
	id, node := req.GetVolumeId(), req.GetNodeId()
	if id == "" {
		return nil, status.Errorf(codes.InvalidArgument, "%s: volume id is missing", method)
	}
	if node == "" {
		return nil, status.Errorf(codes.InvalidArgument, "%s %s: node id is missing", method, id)
	}
	if err := checkCapability(req.GetVolumeCapability()); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "%s %s: %v", method, id, err)
	}
	if err := volumeID(method, id); err != nil {
		return nil, err
	}
	err := c.backing.Attach(ctx, id, node)
	var elsewhere *AttachedElsewhereError
	switch {
	case errors.As(err, &elsewhere):
		return nil, status.Errorf(codes.FailedPrecondition, "%s %s to node %s: attached to node %s: %v", method, id, node, elsewhere.Node, err)
	case errors.Is(err, ErrNotFound), errors.Is(err, ErrNodeNotFound):
		return nil, status.Errorf(codes.NotFound, "%s %s to node %s: %v", method, id, node, err)
	case err != nil:
		return nil, status.Errorf(codes.Internal, "%s %s to node %s: %v", method, id, node, err)
	}
	c.log.Info("volume attached", "volume", id, "node", node)
	return &csi.ControllerPublishVolumeResponse{}, nil
}

// ControllerUnpublishVolume detaches the volume from the node. Not attached there, or no
// such volume or node: nothing to do (CSI: 0 OK).
func (c *Controller) ControllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	id, node := req.GetVolumeId(), req.GetNodeId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "ControllerUnpublishVolume: volume id is missing")
	}
	if !ValidID(id) {
		return &csi.ControllerUnpublishVolumeResponse{}, nil
	}
	// An empty node id asks to detach from every node: the node it is attached to.
	if node == "" {
		vol, err := c.backing.Get(ctx, id)
		if errors.Is(err, ErrNotFound) {
			return &csi.ControllerUnpublishVolumeResponse{}, nil
		}
		if err != nil {
			return nil, status.Errorf(codes.Internal, "ControllerUnpublishVolume %s: %v", id, err)
		}
		if node = vol.AttachedTo; node == "" {
			return &csi.ControllerUnpublishVolumeResponse{}, nil
		}
	}
	err := c.backing.Detach(ctx, id, node)
	if err != nil && !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrNodeNotFound) {
		return nil, status.Errorf(codes.Internal, "ControllerUnpublishVolume %s from node %s: %v", id, node, err)
	}
	c.log.Info("volume detached", "volume", id, "node", node)
	return &csi.ControllerUnpublishVolumeResponse{}, nil
}

// ValidateVolumeCapabilities confirms the capabilities the driver supports.
func (c *Controller) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	const method = "ValidateVolumeCapabilities"
	id := req.GetVolumeId()
	if err := volumeID(method, id); err != nil {
		return nil, err
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, status.Errorf(codes.InvalidArgument, "%s %s: volume capabilities are missing", method, id)
	}
	if _, err := c.backing.Get(ctx, id); errors.Is(err, ErrNotFound) {
		return nil, status.Errorf(codes.NotFound, "%s %s: %v", method, id, err)
	} else if err != nil {
		return nil, status.Errorf(codes.Internal, "%s %s: %v", method, id, err)
	}
	if err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil
	}
	if err := checkParameters(req.GetParameters()); err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}

// ControllerExpandVolume grows the volume's storage; the node then grows its file system.
func (c *Controller) ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	const method = "ControllerExpandVolume"
	id := req.GetVolumeId()
	if id == "" {
		return nil, status.Errorf(codes.InvalidArgument, "%s: volume id is missing", method)
	}
	if req.GetCapacityRange() == nil {
		return nil, status.Errorf(codes.InvalidArgument, "%s %s: capacity range is missing", method, id)
	}
	if req.GetVolumeCapability() != nil {
		if err := checkCapability(req.GetVolumeCapability()); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "%s %s: %v", method, id, err)
		}
	}
	if err := volumeID(method, id); err != nil {
		return nil, err
	}
	bytes, err := capacity(req.GetCapacityRange())
	if err != nil {
		return nil, err
	}
	got, err := c.backing.Expand(ctx, id, bytes)
	if errors.Is(err, ErrNotFound) {
		return nil, status.Errorf(codes.NotFound, "%s %s: %v", method, id, err)
	}
	if err != nil {
		return nil, status.Errorf(codes.Internal, "%s %s to %d bytes: %v", method, id, bytes, err)
	}
	c.log.Info("volume expanded", "volume", id, "bytes", got)
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: got, NodeExpansionRequired: true}, nil
}

// ControllerGetCapabilities lists what the controller does.
func (c *Controller) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	var caps []*csi.ControllerServiceCapability
	for _, t := range []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
		csi.ControllerServiceCapability_RPC_EXPAND_VOLUME,
	} {
		caps = append(caps, &csi.ControllerServiceCapability{Type: &csi.ControllerServiceCapability_Rpc{
			Rpc: &csi.ControllerServiceCapability_RPC{Type: t},
		}})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}
