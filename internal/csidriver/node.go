package csidriver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// NodeConfig is what the node service needs from the node program.
type NodeConfig struct {
	// NodeName is this node's Kubernetes name: the CSI node id, the node Backing.Attach names.
	NodeName string
	// KeySource releases volume keys to this node.
	KeySource KeySource
	// Devices finds an attached volume on this node.
	Devices Devices
	// Unlocker opens and mounts a device with its key.
	Unlocker Unlocker
	// Logger logs each staged and unstaged volume.
	Logger *slog.Logger
}

// Node is the CSI node service: it stages a volume attached to this node (its key from the
// cluster, then the Unlocker) and bind-mounts the staged view into pods.
type Node struct {
	csi.UnimplementedNodeServer
	cfg NodeConfig
	log *slog.Logger

	mu       sync.Mutex
	inFlight map[string]bool
}

// NewNode returns the node service.
func NewNode(cfg NodeConfig) *Node {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Node{cfg: cfg, log: log, inFlight: map[string]bool{}}
}

// lock marks id busy: the kubelet may retry an operation while the first still runs (a slow
// unlock); the retry gets Aborted and comes back, as the CSI spec asks.
func (n *Node) lock(method, id string) (func(), error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.inFlight[id] {
		return nil, status.Errorf(codes.Aborted, "%s %s: another operation on the volume is in progress", method, id)
	}
	n.inFlight[id] = true
	return func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		delete(n.inFlight, id)
	}, nil
}

// NodeStageVolume unlocks the volume at the staging path: its key from the cluster, its
// device on this node, then the Unlocker (which formats only a device of zeros).
func (n *Node) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	const method = "NodeStageVolume"
	id, staging := req.GetVolumeId(), req.GetStagingTargetPath()
	if err := volumeID(method, id); err != nil {
		return nil, err
	}
	if staging == "" {
		return nil, status.Errorf(codes.InvalidArgument, "%s %s: staging target path is missing", method, id)
	}
	if err := checkCapability(req.GetVolumeCapability()); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "%s %s: %v", method, id, err)
	}
	unlock, err := n.lock(method, id)
	if err != nil {
		return nil, err
	}
	defer unlock()

	key, err := n.cfg.KeySource.VolumeKey(ctx, id)
	// The key lives only as long as this call: cleared however Stage ends.
	defer clear(key)
	if err != nil {
		return nil, keyError(method, id, err)
	}
	device, err := n.cfg.Devices.Device(ctx, id)
	switch {
	case errors.Is(err, ErrNotAttached):
		return nil, status.Errorf(codes.FailedPrecondition, "%s %s: %v", method, id, err)
	case errors.Is(err, ErrNotFound):
		return nil, status.Errorf(codes.NotFound, "%s %s: %v", method, id, err)
	case err != nil:
		return nil, status.Errorf(codes.Internal, "%s %s: finding the device: %v", method, id, err)
	}
	if err := n.cfg.Unlocker.Stage(ctx, device, key, staging); err != nil {
		if errors.Is(err, ErrWrongKey) {
			return nil, status.Errorf(codes.FailedPrecondition, "%s %s: %v", method, id, err)
		}
		return nil, status.Errorf(codes.Internal, "%s %s: %v", method, id, err)
	}
	n.log.Info("volume staged", "volume", id, "device", device, "staging", staging)
	return &csi.NodeStageVolumeResponse{}, nil
}

// keyError maps a KeySource failure: a refusal is PermissionDenied (the cluster decided), an
// unreachable key source is Unavailable (the kubelet retries).
func keyError(method, id string, err error) error {
	if errors.Is(err, ErrKeyRefused) {
		return status.Errorf(codes.PermissionDenied, "%s %s: %v", method, id, err)
	}
	if st, ok := status.FromError(err); ok && st.Code() == codes.PermissionDenied {
		return status.Errorf(codes.PermissionDenied, "%s %s: volume key refused: %v", method, id, err)
	}
	return status.Errorf(codes.Unavailable, "%s %s: getting the volume key: %v", method, id, err)
}

// NodeUnstageVolume locks the volume: the Unlocker unmounts and closes what Stage opened.
func (n *Node) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	const method = "NodeUnstageVolume"
	id, staging := req.GetVolumeId(), req.GetStagingTargetPath()
	if err := volumeID(method, id); err != nil {
		return nil, err
	}
	if staging == "" {
		return nil, status.Errorf(codes.InvalidArgument, "%s %s: staging target path is missing", method, id)
	}
	unlock, err := n.lock(method, id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := n.cfg.Unlocker.Unstage(ctx, staging); err != nil {
		return nil, status.Errorf(codes.Internal, "%s %s: %v", method, id, err)
	}
	n.log.Info("volume unstaged", "volume", id, "staging", staging)
	return &csi.NodeUnstageVolumeResponse{}, nil
}

// NodePublishVolume bind-mounts the staged volume at the pod's target path (read-only if
// asked), without set-user-id programs or device files.
func (n *Node) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	const method = "NodePublishVolume"
	id, target, staging := req.GetVolumeId(), req.GetTargetPath(), req.GetStagingTargetPath()
	if err := volumeID(method, id); err != nil {
		return nil, err
	}
	if target == "" {
		return nil, status.Errorf(codes.InvalidArgument, "%s %s: target path is missing", method, id)
	}
	if staging == "" {
		return nil, status.Errorf(codes.InvalidArgument, "%s %s: staging target path is missing", method, id)
	}
	if err := checkCapability(req.GetVolumeCapability()); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "%s %s: %v", method, id, err)
	}
	unlock, err := n.lock(method, id)
	if err != nil {
		return nil, err
	}
	defer unlock()

	if staged, err := mounted(staging); err != nil {
		return nil, status.Errorf(codes.Internal, "%s %s: %v", method, id, err)
	} else if !staged {
		return nil, status.Errorf(codes.FailedPrecondition, "%s %s: the volume is not staged at %s", method, id, staging)
	}
	if done, err := mounted(target); err != nil {
		return nil, status.Errorf(codes.Internal, "%s %s: %v", method, id, err)
	} else if done {
		return &csi.NodePublishVolumeResponse{}, nil
	}
	readOnly := req.GetReadonly() || req.GetVolumeCapability().GetAccessMode().GetMode() == csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY
	if err := bindMount(staging, target, readOnly); err != nil {
		return nil, status.Errorf(codes.Internal, "%s %s: %v", method, id, err)
	}
	n.log.Info("volume published", "volume", id, "target", target, "readOnly", readOnly)
	return &csi.NodePublishVolumeResponse{}, nil
}

// bindMount mounts source at target; flags other than bind apply by a remount (the kernel
// ignores them on the bind itself).
func bindMount(source, target string, readOnly bool) error {
	if err := os.MkdirAll(target, 0o750); err != nil {
		return fmt.Errorf("creating target path: %w", err)
	}
	if err := unix.Mount(source, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mounting %s at %s: %w", source, target, err)
	}
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_NOSUID | unix.MS_NODEV)
	if readOnly {
		flags |= unix.MS_RDONLY
	}
	if err := unix.Mount("", target, "", flags, ""); err != nil {
		unmountErr := unix.Unmount(target, 0)
		return errors.Join(fmt.Errorf("restricting the mount at %s: %w", target, err), unmountErr)
	}
	return nil
}

// NodeUnpublishVolume unmounts the target path and removes it. Gone already: nothing to do.
func (n *Node) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	const method = "NodeUnpublishVolume"
	id, target := req.GetVolumeId(), req.GetTargetPath()
	if err := volumeID(method, id); err != nil {
		return nil, err
	}
	if target == "" {
		return nil, status.Errorf(codes.InvalidArgument, "%s %s: target path is missing", method, id)
	}
	unlock, err := n.lock(method, id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if _, err := os.Lstat(target); errors.Is(err, os.ErrNotExist) {
		return &csi.NodeUnpublishVolumeResponse{}, nil
	}
	isMounted, err := mounted(target)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "%s %s: %v", method, id, err)
	}
	if isMounted {
		if err := unix.Unmount(target, 0); err != nil {
			return nil, status.Errorf(codes.Internal, "%s %s: unmounting %s: %v", method, id, target, err)
		}
	}
	// Remove, not RemoveAll: the target is an empty directory once unmounted; anything else
	// in it is not ours to delete.
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, status.Errorf(codes.Internal, "%s %s: removing target path: %v", method, id, err)
	}
	n.log.Info("volume unpublished", "volume", id, "target", target)
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// mountedPath answers NotFound for a volume path that is not a mounted volume.
func mountedPath(method, id, path string) error {
	if path == "" {
		return status.Errorf(codes.InvalidArgument, "%s %s: volume path is missing", method, id)
	}
	isMounted, err := mounted(path)
	if err != nil {
		return status.Errorf(codes.Internal, "%s %s: %v", method, id, err)
	}
	if !isMounted {
		return status.Errorf(codes.NotFound, "%s %s: no volume is mounted at %s", method, id, path)
	}
	return nil
}

// NodeGetVolumeStats reports the mounted volume's capacity and use.
func (n *Node) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	const method = "NodeGetVolumeStats"
	id, path := req.GetVolumeId(), req.GetVolumePath()
	if id == "" {
		return nil, status.Errorf(codes.InvalidArgument, "%s: volume id is missing", method)
	}
	if path == "" {
		return nil, status.Errorf(codes.InvalidArgument, "%s %s: volume path is missing", method, id)
	}
	if err := volumeID(method, id); err != nil {
		return nil, err
	}
	if err := mountedPath(method, id, path); err != nil {
		return nil, err
	}
	st, err := n.cfg.Unlocker.Stats(ctx, path)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "%s %s: %v", method, id, err)
	}
	return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
		{Unit: csi.VolumeUsage_BYTES, Total: st.TotalBytes, Available: st.AvailableBytes, Used: st.UsedBytes},
		{Unit: csi.VolumeUsage_INODES, Total: st.TotalInodes, Available: st.FreeInodes, Used: st.UsedInodes},
	}}, nil
}

// NodeExpandVolume grows the mounted file system to its (grown) device's size.
func (n *Node) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	const method = "NodeExpandVolume"
	id, path := req.GetVolumeId(), req.GetVolumePath()
	if id == "" {
		return nil, status.Errorf(codes.InvalidArgument, "%s: volume id is missing", method)
	}
	if path == "" {
		return nil, status.Errorf(codes.InvalidArgument, "%s %s: volume path is missing", method, id)
	}
	if err := volumeID(method, id); err != nil {
		return nil, err
	}
	if req.GetVolumeCapability() != nil {
		if err := checkCapability(req.GetVolumeCapability()); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "%s %s: %v", method, id, err)
		}
	}
	// The staged path when the kubelet names it, else the published one: the Unlocker finds
	// what is under either.
	if staging := req.GetStagingTargetPath(); staging != "" {
		path = staging
	}
	if err := mountedPath(method, id, path); err != nil {
		return nil, err
	}
	unlock, err := n.lock(method, id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := n.cfg.Unlocker.Expand(ctx, path); err != nil {
		return nil, status.Errorf(codes.Internal, "%s %s: %v", method, id, err)
	}
	st, err := n.cfg.Unlocker.Stats(ctx, path)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "%s %s: %v", method, id, err)
	}
	n.log.Info("volume expanded on the node", "volume", id, "bytes", st.TotalBytes)
	return &csi.NodeExpandVolumeResponse{CapacityBytes: st.TotalBytes}, nil
}

// NodeGetCapabilities lists what the node service does.
func (n *Node) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	var caps []*csi.NodeServiceCapability
	for _, t := range []csi.NodeServiceCapability_RPC_Type{
		csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csi.NodeServiceCapability_RPC_EXPAND_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
	} {
		caps = append(caps, &csi.NodeServiceCapability{Type: &csi.NodeServiceCapability_Rpc{
			Rpc: &csi.NodeServiceCapability_RPC{Type: t},
		}})
	}
	return &csi.NodeGetCapabilitiesResponse{Capabilities: caps}, nil
}

// NodeGetInfo names this node; the platform, not a count, limits its volumes.
func (n *Node) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{NodeId: n.cfg.NodeName, MaxVolumesPerNode: 0}, nil
}

// mounted reports whether path is a mount point; a path that does not exist is not.
func mounted(path string) (bool, error) {
	ok, err := mountinfo.Mounted(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if errors.Is(err, unix.ENOTCONN) {
		// A FUSE mount whose daemon died: still mounted.
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("checking whether %s is mounted: %w", path, err)
	}
	return ok, nil
}
