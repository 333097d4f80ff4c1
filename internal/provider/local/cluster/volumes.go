package cluster

import (
	"context"
	"fmt"
	"sync"

	"github.com/openconstellation/constellation/internal/provider/local/volumestore"
)

// pluggedVolumes is the volume storage of machines whose volumes are disks (VolumeDisks):
// the store's records say which node holds a volume, and the disk follows them. A node's
// lookup of its volume plugs the disk; a detach unplugs it first. One lock orders both, so
// a lookup racing a detach never leaves a disk plugged into a node that no longer holds the
// volume (ReadWriteOnce: one machine writes a volume's file at a time).
type pluggedVolumes struct {
	*volumestore.Store
	disks VolumeDisks
	mu    sync.Mutex
}

// Path plugs the volume's disk into node's machine if node holds the volume, and returns
// its backing file (the node finds the disk by the volume's id).
func (v *pluggedVolumes) Path(ctx context.Context, id, node string) (string, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	file, err := v.Store.Path(ctx, id, node)
	if err != nil {
		return "", err
	}
	if err := v.disks.PlugVolume(ctx, node, id, file); err != nil {
		return "", fmt.Errorf("plugging volume %s into %s: %w", id, node, err)
	}
	return file, nil
}

// Detach unplugs the volume's disk from node's machine, then releases the attachment. A
// disk that cannot be unplugged keeps the volume attached: the retried detach tries again.
func (v *pluggedVolumes) Detach(ctx context.Context, id, node string) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := v.disks.UnplugVolume(ctx, node, id); err != nil {
		return fmt.Errorf("unplugging volume %s from %s: %w", id, node, err)
	}
	return v.Store.Detach(ctx, id, node)
}
