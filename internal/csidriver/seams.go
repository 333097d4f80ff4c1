// Package csidriver is the cluster's CSI driver for encrypted volumes that move with their
// pods (docs/volumes.md): a controller half that creates, attaches, detaches, expands and
// deletes provider-backed storage, and a node half that unlocks an attached volume with a key
// only the cluster can derive and mounts it for the kubelet.
//
// The driver does not know the platform. It reaches it through three seams:
//   - Backing (controller side): the platform's storage API (local provider: volume files kept
//     by the provider on the host; a VM or cloud: a virtio or managed disk);
//   - Devices (node side): where an attached volume appears on this node (a block device);
//   - Unlocker (node side): how a device is opened with the volume's key and mounted (local:
//     ext4 on a loop device holding a gocryptfs tree; a VM: LUKS2 with integrity, then ext4);
//
// and one seam to the cluster: KeySource, the volume's key, released by the join service only
// to an attested node with a pod that uses the volume.
package csidriver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
)

// Name is the driver's name: the CSIDriver object, the StorageClass's provisioner, the
// kubelet plugin's registration and every PersistentVolume's spec.csi.driver.
const Name = "volumes.constellation.openconstellation.dev"

// Volume is what the platform keeps of a volume.
type Volume struct {
	// ID is the volume's handle (spec.csi.volumeHandle): the name the provisioner chose
	// (pvc-<uid>), checked by ValidID.
	ID string
	// Bytes is the backing storage's size.
	Bytes int64
	// AttachedTo names the node the volume is attached to, "" when detached.
	AttachedTo string
}

// Backing is the platform's storage API, used by the controller half only. Every method is
// idempotent: a retried request (a restarted sidecar, a killed controller) does what the first
// would have done, or nothing when it is already done.
type Backing interface {
	// Create makes a volume of the given size with nothing on it (zeros), or returns the
	// existing one when it has that size; another size fails with ErrExists.
	Create(ctx context.Context, id string, bytes int64) (Volume, error)
	// Get returns the volume, or an error wrapping ErrNotFound.
	Get(ctx context.Context, id string) (Volume, error)
	// Delete removes the volume's storage, and only that. A volume that does not exist is
	// deleted already; an attached one is refused with ErrAttached.
	Delete(ctx context.Context, id string) error
	// Attach makes the volume reachable by the node. Attached to this node already: nothing
	// to do. Attached to another node: *AttachedElsewhereError (ReadWriteOnce: one node at a
	// time, enforced by the platform and not only by Kubernetes).
	Attach(ctx context.Context, id, node string) error
	// Detach undoes Attach. Not attached to that node (or not at all): nothing to do.
	Detach(ctx context.Context, id, node string) error
	// Expand grows the volume's storage to at least bytes and returns its new size. Shrinking
	// is refused.
	Expand(ctx context.Context, id string, bytes int64) (int64, error)
}

// Devices tells the node half where an attached volume appears on this node.
type Devices interface {
	// Device returns the path of the volume's block device (or backing file) on this node. A
	// volume not attached to this node is an error wrapping ErrNotAttached.
	Device(ctx context.Context, id string) (string, error)
}

// Unlocker opens a device with a volume's key and mounts the plaintext file system, the node
// platform's way.
type Unlocker interface {
	// Stage mounts the volume's plaintext view at target. A device with nothing on it (only
	// zeros) is formatted first; a device with anything else on it is never formatted: a key
	// that does not open it is an error, and the data stays as it was. Staging a target that
	// is mounted already is nothing to do.
	Stage(ctx context.Context, device string, key []byte, target string) error
	// Unstage unmounts target and closes what Stage opened. Not mounted: nothing to do.
	Unstage(ctx context.Context, target string) error
	// Expand grows the mounted file system at target to its device's size.
	Expand(ctx context.Context, target string) error
	// Stats reports the mounted file system's capacity and use (NodeGetVolumeStats).
	Stats(ctx context.Context, target string) (Stats, error)
}

// Stats is a mounted volume's use.
type Stats struct {
	TotalBytes, AvailableBytes, UsedBytes int64
	TotalInodes, FreeInodes, UsedInodes   int64
}

// KeySource releases a volume's key to this node.
type KeySource interface {
	// VolumeKey returns the volume's 32-byte key. The cluster releases it only to an attested
	// node that has a pod using the volume and the volume attached; any other request is
	// refused with an error naming the reason.
	VolumeKey(ctx context.Context, id string) ([]byte, error)
}

var (
	// ErrNotFound: the platform has no volume of that id.
	ErrNotFound = errors.New("volume not found")
	// ErrExists: a volume of that id exists with another size.
	ErrExists = errors.New("volume exists with another size")
	// ErrAttached: the volume is attached and cannot be deleted.
	ErrAttached = errors.New("volume is attached")
	// ErrNotAttached: the volume is not attached to this node.
	ErrNotAttached = errors.New("volume is not attached to this node")
	// ErrNodeNotFound: Backing.Attach names a node the platform does not know (CSI: NotFound).
	ErrNodeNotFound = errors.New("node not found")
	// ErrKeyRefused: KeySource's answer when the cluster refuses to release the key (CSI:
	// PermissionDenied). An error without it is taken as the key source being unreachable
	// (Unavailable: the kubelet retries).
	ErrKeyRefused = errors.New("volume key refused")
	// ErrWrongKey: Unlocker.Stage's answer when the key does not open what is on the device
	// (CSI: FailedPrecondition). Nothing on the device was changed.
	ErrWrongKey = errors.New("the key does not open the volume")
)

// AttachedElsewhereError refuses attaching a volume that another node holds.
type AttachedElsewhereError struct {
	ID, Node string
}

func (e *AttachedElsewhereError) Error() string {
	return fmt.Sprintf("volume %s is attached to node %s", e.ID, e.Node)
}

// IDFor is the volume id of the CreateVolume request named name: "vol-" and the first 32 hex
// digits of the name's SHA-256. A pure function of the name, so a retried CreateVolume finds
// the volume its first try made; fixed-form, so an id is safe as a file name, an object name
// and a key derivation's id on every platform.
func IDFor(name string) string {
	sum := sha256.Sum256([]byte(name))
	return "vol-" + hex.EncodeToString(sum[:16])
}

var idPattern = regexp.MustCompile(`^vol-[0-9a-f]{32}$`)

// ValidID reports whether id has the form IDFor gives. Every seam checks it on input.
func ValidID(id string) bool { return idPattern.MatchString(id) }
