package csidriver_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/openconstellation/constellation/internal/csidriver"
)

// memBacking is an in-memory platform: volumes, their sizes and attachments, and the nodes it
// knows. Devices hands out the path <dir>/<id>.img; with sparse set, each volume is a sparse
// file there, as the local provider keeps them.
type memBacking struct {
	mu     sync.Mutex
	vols   map[string]*csidriver.Volume
	nodes  map[string]bool
	dir    string
	sparse bool
	// err, when set, fails every call (a broken platform).
	err error
}

func newMemBacking(dir string, nodes ...string) *memBacking {
	b := &memBacking{vols: map[string]*csidriver.Volume{}, nodes: map[string]bool{}, dir: dir}
	for _, n := range nodes {
		b.nodes[n] = true
	}
	return b
}

func (b *memBacking) file(id string) string { return filepath.Join(b.dir, id+".img") }

func (b *memBacking) Create(_ context.Context, id string, bytes int64) (csidriver.Volume, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		return csidriver.Volume{}, b.err
	}
	if v, ok := b.vols[id]; ok {
		if v.Bytes != bytes {
			return csidriver.Volume{}, fmt.Errorf("volume %s has %d bytes: %w", id, v.Bytes, csidriver.ErrExists)
		}
		return *v, nil
	}
	if b.sparse {
		f, err := os.OpenFile(b.file(id), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return csidriver.Volume{}, err
		}
		defer f.Close()
		if err := f.Truncate(bytes); err != nil {
			return csidriver.Volume{}, err
		}
	}
	b.vols[id] = &csidriver.Volume{ID: id, Bytes: bytes}
	return *b.vols[id], nil
}

func (b *memBacking) Get(_ context.Context, id string) (csidriver.Volume, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		return csidriver.Volume{}, b.err
	}
	v, ok := b.vols[id]
	if !ok {
		return csidriver.Volume{}, fmt.Errorf("volume %s: %w", id, csidriver.ErrNotFound)
	}
	return *v, nil
}

func (b *memBacking) Delete(_ context.Context, id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		return b.err
	}
	v, ok := b.vols[id]
	if !ok {
		return nil
	}
	if v.AttachedTo != "" {
		return fmt.Errorf("volume %s on node %s: %w", id, v.AttachedTo, csidriver.ErrAttached)
	}
	if b.sparse {
		if err := os.Remove(b.file(id)); err != nil {
			return err
		}
	}
	delete(b.vols, id)
	return nil
}

func (b *memBacking) Attach(_ context.Context, id, node string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		return b.err
	}
	v, ok := b.vols[id]
	if !ok {
		return fmt.Errorf("volume %s: %w", id, csidriver.ErrNotFound)
	}
	if !b.nodes[node] {
		return fmt.Errorf("node %s: %w", node, csidriver.ErrNodeNotFound)
	}
	if v.AttachedTo != "" && v.AttachedTo != node {
		return &csidriver.AttachedElsewhereError{ID: id, Node: v.AttachedTo}
	}
	v.AttachedTo = node
	return nil
}

func (b *memBacking) Detach(_ context.Context, id, node string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		return b.err
	}
	if v, ok := b.vols[id]; ok && v.AttachedTo == node {
		v.AttachedTo = ""
	}
	return nil
}

func (b *memBacking) Expand(_ context.Context, id string, bytes int64) (int64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		return 0, b.err
	}
	v, ok := b.vols[id]
	if !ok {
		return 0, fmt.Errorf("volume %s: %w", id, csidriver.ErrNotFound)
	}
	if bytes <= v.Bytes {
		return v.Bytes, nil
	}
	if b.sparse {
		if err := os.Truncate(b.file(id), bytes); err != nil {
			return 0, err
		}
	}
	v.Bytes = bytes
	return v.Bytes, nil
}

// devices is memBacking's Devices for one node.
type devices struct {
	b    *memBacking
	node string
}

func (d devices) Device(_ context.Context, id string) (string, error) {
	d.b.mu.Lock()
	defer d.b.mu.Unlock()
	v, ok := d.b.vols[id]
	if !ok {
		return "", fmt.Errorf("volume %s: %w", id, csidriver.ErrNotFound)
	}
	if v.AttachedTo != d.node {
		return "", fmt.Errorf("volume %s: %w", id, csidriver.ErrNotAttached)
	}
	return d.b.file(id), nil
}

// keys is a KeySource: a fixed key per volume, or refusal.
type keys struct {
	mu      sync.Mutex
	err     error
	handed  [][]byte
	refused map[string]bool
}

func (k *keys) VolumeKey(_ context.Context, id string) ([]byte, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.err != nil {
		return nil, k.err
	}
	if k.refused[id] {
		return nil, fmt.Errorf("no pod on this node uses volume %s: %w", id, csidriver.ErrKeyRefused)
	}
	key := make([]byte, 32)
	copy(key, id)
	k.handed = append(k.handed, key)
	return key, nil
}
