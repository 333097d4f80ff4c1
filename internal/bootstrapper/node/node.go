// Package node is what init and join share on a node: the one-shot node lock, the state
// storage, and the order in which a node commits to a cluster (docs/node-lifecycle.md):
//
//  1. take the node lock, which extends PCR 15 with the cluster ID;
//  2. re-key the storage from the fresh node's random key to the derived disk key;
//  3. mark the storage initialized;
//  4. unlock it.
//
// Only then are credentials written and kubeadm run. A rebooted node (initialized storage)
// checks the disk key it was given (by a rejoin ticket, or by `constellation recover`), takes
// the lock with the cluster ID that came with it, then unlocks (ReenterAs).
package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/openconstellation/constellation/internal/bootstrapper/nodelock"
	"github.com/openconstellation/constellation/internal/statedisk"
)

// State is what a node finds at boot.
type State int

// States at boot.
const (
	// Fresh: the node has no cluster; its storage was (re)created with a random key.
	Fresh State = iota + 1
	// Rebooted: the storage belongs to a cluster; the node needs a rejoin ticket.
	Rebooted
)

func (s State) String() string {
	switch s {
	case Fresh:
		return "fresh"
	case Rebooted:
		return "rebooted"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// Kubeadm runs kubeadm; internal/kube/kubeadm runs the real binary.
type Kubeadm interface {
	// Init runs `kubeadm init` with config, writing its output to out.
	Init(ctx context.Context, config []byte, out io.Writer) error
	// Join runs `kubeadm join` with config, writing its output to out.
	Join(ctx context.Context, config []byte, out io.Writer) error
}

// Kubelet is the node's service manager for the kubelet (systemd on a VM, the sandbox's
// supervisor in the local provider).
type Kubelet interface {
	// Restart (re)starts the kubelet with the configuration on the node.
	Restart(ctx context.Context) error
}

// Node is one node's lock and storage.
type Node struct {
	lock    *nodelock.Lock
	storage statedisk.Storage
	state   State

	mu        sync.Mutex
	freshKey  []byte // the random key of a fresh node's storage, until re-keyed
	clusterID []byte // the cluster the node lock names, once taken here

	claimed     chan struct{} // closed once the node lock is taken here
	claimedOnce sync.Once
}

// Open finds out the node's state and, for a fresh node, (re)creates its storage keyed with
// a random key: storage without the initialized marker never held cluster data, so it is
// replaced (an earlier boot's random key is gone with that boot).
func Open(ctx context.Context, lock *nodelock.Lock, storage statedisk.Storage) (*Node, error) {
	n := &Node{lock: lock, storage: storage, claimed: make(chan struct{})}
	exists, err := storage.Exists()
	if err != nil {
		return nil, fmt.Errorf("checking state storage: %w", err)
	}
	if exists {
		initialized, err := storage.Initialized()
		if err != nil {
			return nil, fmt.Errorf("checking state storage: %w", err)
		}
		if initialized {
			n.state = Rebooted
			return n, nil
		}
	}
	key, err := statedisk.NewRandomKey()
	if err != nil {
		return nil, err
	}
	if err := storage.Create(ctx, key); err != nil {
		return nil, fmt.Errorf("creating state storage: %w", err)
	}
	n.state, n.freshKey = Fresh, key
	return n, nil
}

// State returns the state the node was opened in.
func (n *Node) State() State { return n.state }

// DiskUUID returns the storage's UUID, the id of its key.
func (n *Node) DiskUUID() (string, error) {
	id, err := n.storage.UUID()
	if err != nil {
		return "", fmt.Errorf("reading state storage UUID: %w", err)
	}
	return id, nil
}

// Claimed is closed once Claim or ReenterAs has taken the node lock: the loser of init and
// join, or of rejoin and recovery, stops.
func (n *Node) Claimed() <-chan struct{} { return n.claimed }

// LockHolder returns who holds the node lock, or "".
func (n *Node) LockHolder() string { return n.lock.Holder() }

// ErrNotFresh is returned by Claim on a node that was not fresh at boot.
var ErrNotFresh = errors.New("node is not fresh: its state storage belongs to a cluster (reboot path only)")

// Claim commits a fresh node to a cluster for holder ("init" or "join"): it takes the node
// lock (PCR 15 extended with clusterID), re-keys the storage to diskKey, marks it
// initialized and unlocks it. If the lock is taken it returns an error wrapping
// nodelock.ErrLocked and changes nothing.
func (n *Node) Claim(ctx context.Context, holder string, clusterID, diskKey []byte) error {
	if n.state != Fresh {
		return ErrNotFresh
	}
	if err := n.lock.TryLock(holder, clusterID); err != nil {
		return err
	}
	n.claimedOnce.Do(func() { close(n.claimed) })
	n.mu.Lock()
	defer n.mu.Unlock()
	n.clusterID = bytes.Clone(clusterID)
	if err := n.storage.Rekey(ctx, n.freshKey, diskKey); err != nil {
		return fmt.Errorf("re-keying state storage to the disk key: %w", err)
	}
	n.freshKey = nil
	if err := n.storage.MarkInitialized(); err != nil {
		return fmt.Errorf("marking state storage initialized: %w", err)
	}
	if err := n.storage.Unlock(ctx, diskKey); err != nil {
		return fmt.Errorf("unlocking state storage: %w", err)
	}
	return nil
}

// Holders of the node lock on a rebooted node.
const (
	// HolderRejoin: the node re-entered with a rejoin ticket of its join service.
	HolderRejoin = "rejoin"
	// HolderRecover: the node re-entered with the keys `constellation recover` sent.
	HolderRecover = "recover"
)

// Reenter is ReenterAs for the rejoin path (holder HolderRejoin).
func (n *Node) Reenter(ctx context.Context, clusterID, diskKey []byte) error {
	return n.ReenterAs(ctx, HolderRejoin, clusterID, diskKey)
}

// ReenterAs brings a rebooted node back into its cluster for holder (HolderRejoin,
// HolderRecover):
//
//  1. it checks diskKey against the storage (statedisk.Storage.CheckKey). A key that does
//     not open it returns an error wrapping statedisk.ErrWrongKey, and nothing has changed:
//     PCR 15 is still zero, the storage locked;
//  2. it takes the node lock with the cluster ID (PCR 15). A bootstrapper restarted within
//     the boot in which the node was committed finds PCR 15 already carrying this cluster's
//     marker and resumes without extending it again; another cluster's marker is refused
//     (nodelock.ErrOtherCluster). If the lock was taken in this process (the rejoin and the
//     recovery race on a control plane) it returns an error wrapping nodelock.ErrLocked and
//     changes nothing;
//  3. it unlocks the storage.
//
// Checking before locking matters: the lock cannot be undone in this boot, so a node that
// took it with a key that does not open its storage would be stuck until the next reboot.
func (n *Node) ReenterAs(ctx context.Context, holder string, clusterID, diskKey []byte) error {
	if n.state != Rebooted {
		return errors.New("node is fresh: it has no cluster to re-enter")
	}
	if err := n.storage.CheckKey(ctx, diskKey); err != nil {
		return fmt.Errorf("checking the disk key: %w", err)
	}
	if err := n.lock.Resume(holder, clusterID); err != nil {
		return err
	}
	n.claimedOnce.Do(func() { close(n.claimed) })
	n.mu.Lock()
	n.clusterID = bytes.Clone(clusterID)
	n.mu.Unlock()
	if err := n.storage.Unlock(ctx, diskKey); err != nil {
		return fmt.Errorf("unlocking state storage: %w", err)
	}
	return nil
}

// ClusterID returns the ID of the cluster whose node lock this node took (Claim, ReenterAs),
// or nil before: what the node checks every service it later asks for keys against.
func (n *Node) ClusterID() []byte {
	n.mu.Lock()
	defer n.mu.Unlock()
	return bytes.Clone(n.clusterID)
}
