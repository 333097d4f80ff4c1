// Package nodelock decides, once per boot, whether a node initializes a new cluster or joins
// an existing one. Init (the CLI's request) and join (the node's own attempt) race on a
// fresh node; exactly one wins, and the winner marks the node as belonging to its cluster by
// extending PCR 15 with the cluster ID before anything irreversible happens (docs/design.md
// "2.4 The initialized marker (PCR 15)"). From then on the node's evidence names its cluster,
// and it can never attest as a fresh node again in this boot.
//
// The register is the node's attestation variant's cluster-ID register
// (variant.Variant.ClusterIDRegister: PCR 15 for the TPM variants), and its marker the
// variant's (ClusterIDMarker); this package names no register itself.
//
// The lock lives in the TPM as well as in memory: PCR 15 starts at zero on every boot and
// cannot be reset, so a non-zero PCR 15 means the lock was taken earlier in this boot (by a
// bootstrapper that then crashed and restarted). Such a node refuses both init and join:
// what it holds is state of a cluster it can only re-enter through the reboot path.
package nodelock

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"

	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// ErrLocked is returned when the lock was taken before: by the other of init and join, or
// earlier in this boot.
var ErrLocked = errors.New("node lock already taken: this node has already been initialized or joined a cluster in this boot")

// TPM is what the lock needs of the node's TPM.
type TPM interface {
	ReadPCRs(pcrs ...int) (map[uint32][]byte, error)
	ExtendPCR(idx int, digest []byte) error
}

// Lock is a node's one-shot lock.
type Lock struct {
	tpm TPM
	// register is the variant's cluster-ID register; marker computes its value for a cluster.
	register int
	marker   func(clusterID []byte) []byte

	mu     sync.Mutex
	holder string // who took it: "init" or "join"; "earlier in this boot" if found taken
	// atBoot: the lock was found taken when New read PCR 15 and nobody has resumed it yet.
	// Only such a lock can be resumed: one taken in this process has its winner already.
	atBoot bool
}

// New returns the lock of the node whose TPM is tpm and whose attestation variant is v. It
// reads v's cluster-ID register to find out whether the lock was taken earlier in this boot.
// v's register must be a SHA-256 TPM PCR: the lock extends it through the TPM.
func New(tpm TPM, v variant.Variant) (*Lock, error) {
	reg, ok := v.ClusterIDRegister()
	if !ok {
		return nil, fmt.Errorf("node lock: variant %q has no cluster-ID register", v)
	}
	if v.RegisterLen() != sha256.Size {
		return nil, fmt.Errorf("node lock: variant %q's cluster-ID register %s is not a SHA-256 TPM PCR", v, v.RegisterName(reg))
	}
	pcrs, err := tpm.ReadPCRs(int(reg))
	if err != nil {
		return nil, fmt.Errorf("node lock: reading PCR %d: %w", reg, err)
	}
	value, ok := pcrs[reg]
	if !ok {
		return nil, fmt.Errorf("node lock: TPM did not return PCR %d", reg)
	}
	l := &Lock{tpm: tpm, register: int(reg), marker: v.ClusterIDMarker}
	if !bytes.Equal(value, make([]byte, len(value))) {
		l.holder, l.atBoot = "earlier in this boot", true
	}
	return l, nil
}

// TryLock takes the lock for holder ("init" or "join") and extends PCR 15 with the cluster
// ID (its SHA-256, so the register reads SHA256(0^32 || SHA256(clusterID))). It returns
// ErrLocked, naming the holder, if the lock was taken before; then nothing changes. If the
// extend fails, the lock is not taken and the error is returned.
func (l *Lock) TryLock(holder string, clusterID []byte) error {
	if len(clusterID) == 0 {
		return errors.New("node lock: empty cluster ID")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.holder != "" {
		return fmt.Errorf("%w (taken by %s)", ErrLocked, l.holder)
	}
	digest := sha256.Sum256(clusterID)
	if err := l.tpm.ExtendPCR(l.register, digest[:]); err != nil {
		// The extend may have reached the TPM before the error (a lost response): then
		// the node is marked, and a later attempt must not extend a second time.
		if pcrs, readErr := l.tpm.ReadPCRs(l.register); readErr != nil || !bytes.Equal(pcrs[uint32(l.register)], make([]byte, sha256.Size)) {
			l.holder = fmt.Sprintf("%s (extend of PCR %d reported an error)", holder, l.register)
		}
		return fmt.Errorf("node lock: extending PCR %d: %w", l.register, err)
	}
	l.holder = holder
	return nil
}

// ErrOtherCluster is returned by Resume when the cluster-ID register carries another cluster's marker.
var ErrOtherCluster = errors.New("the cluster-ID register carries another cluster's marker")

// Resume re-enters a lock taken earlier in this boot (a bootstrapper restarted after the
// node was committed) for holder, if PCR 15 reads exactly the marker of clusterID: a single
// extend with this cluster ID and nothing else. It takes a free lock like TryLock. It never
// extends PCR 15 a second time. A lock taken in this process, or already resumed, has its
// winner: Resume returns ErrLocked, so of the rejoin and the recovery of a rebooted node
// exactly one re-enters it.
func (l *Lock) Resume(holder string, clusterID []byte) error {
	l.mu.Lock()
	if l.holder == "" {
		l.mu.Unlock()
		return l.TryLock(holder, clusterID)
	}
	defer l.mu.Unlock()
	if !l.atBoot {
		return fmt.Errorf("%w (taken by %s)", ErrLocked, l.holder)
	}
	pcrs, err := l.tpm.ReadPCRs(l.register)
	if err != nil {
		return fmt.Errorf("node lock: reading PCR %d: %w", l.register, err)
	}
	want := l.marker(clusterID)
	if got := pcrs[uint32(l.register)]; !bytes.Equal(got, want) {
		return fmt.Errorf("%w (taken by %s): PCR %d is %x, this cluster's marker is %x", ErrOtherCluster, l.holder, l.register, got, want)
	}
	l.holder, l.atBoot = holder+" (resumed)", false
	return nil
}

// Holder returns who holds the lock, or "" if nobody does.
func (l *Lock) Holder() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.holder
}
