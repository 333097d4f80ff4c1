// Package statedisk is a node's encrypted state storage: where etcd data, kubelet and
// Kubernetes credentials and container state live, encrypted with the state-disk key that
// only the join service (or, on the first node, the init request) releases.
//
// Lifecycle (docs/node-lifecycle.md):
//
//   - fresh: the storage does not exist. The bootstrapper creates it keyed with a random
//     key (NewRandomKey) so nothing is ever written in the clear, even before the node has
//     a cluster.
//   - init/join: once the node holds the node lock and its ticket, Rekey replaces the
//     random key with the derived state-disk key, Unlock opens it, MarkInitialized records
//     that the storage belongs to a cluster.
//   - reboot: Initialized reports true, so the node asks for a rejoin ticket, whose key
//     unlocks the storage; init and join are not run again. After a full-cluster
//     shutdown the key comes from `constellation recover` instead, and CheckKey tests it
//     before the node commits to anything.
//
// Two backends implement Storage: LUKS2 via cryptsetup (kernels with dm-crypt and
// dm-integrity) and gocryptfs via FUSE (kernels without device-mapper, as on the machines
// the local provider runs on).
package statedisk

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"regexp"
)

// KeySize is the size of a state-disk key, the one name of that size (kms.MasterSecret.StateDiskKey
// derives it with this length). The key unlocks the storage (a LUKS2 keyslot passphrase, a
// gocryptfs master key); 32 bytes is 256 bits of strength for both.
const KeySize = 32

// ErrWrongKey is returned when a key does not unlock the storage.
var ErrWrongKey = errors.New("the key does not unlock the state storage")

// ErrNotCreated is returned by operations on storage that does not exist yet.
var ErrNotCreated = errors.New("state storage not created")

// ErrHeaderRefused marks state storage whose header the node will not use: not the
// header this package makes (a LUKS2 header that fails ParseLUKS2Header's checks). The
// storage exists, so it is never replaced either; no key has met it.
var ErrHeaderRefused = errors.New("the state disk's header is refused")

// headerRefused is an error of ErrHeaderRefused whose message is its cause's: the cause
// names what differs.
type headerRefused struct{ cause error }

func (e headerRefused) Error() string   { return e.cause.Error() }
func (e headerRefused) Unwrap() []error { return []error{ErrHeaderRefused, e.cause} }

// ErrSectorRefused is returned when the storage's authenticated encryption refused what the
// node read from it: on a volume where every sector carries a tag under the volume key, an
// I/O error is what a sector modified, moved or replaced outside the node reads as (a
// failing disk reads the same). Nothing of what was refused reached the node.
var ErrSectorRefused = errors.New("the state disk's authenticated encryption refused what was read from it: sectors modified, moved or replaced outside the node, or a failing disk")

var (
	_ Storage = (*Gocryptfs)(nil)
	_ Storage = (*LUKS2)(nil)
)

// Storage is one node's encrypted state storage.
type Storage interface {
	// Exists reports whether the storage has been created.
	Exists() (bool, error)
	// Create creates the storage keyed with key and a fresh UUID. It refuses to replace
	// existing storage.
	Create(ctx context.Context, key []byte) error
	// UUID returns the storage's UUID (lower-case, 8-4-4-4-12): the id under which the
	// join service derives its key.
	UUID() (string, error)
	// Initialized reports whether MarkInitialized was called: the node belongs to a cluster.
	Initialized() (bool, error)
	// Rekey replaces oldKey with newKey. The data stays; only the key that unlocks it changes.
	Rekey(ctx context.Context, oldKey, newKey []byte) error
	// CheckKey returns nil if key unlocks the storage and ErrWrongKey if it does not,
	// without unlocking it or changing anything: a node that is handed a key by a caller it
	// cannot otherwise authenticate (recovery) checks it before it commits to anything.
	CheckKey(ctx context.Context, key []byte) error
	// Unlock opens the storage with key and makes the plaintext view available.
	Unlock(ctx context.Context, key []byte) error
	// MarkInitialized records that the storage belongs to a cluster.
	MarkInitialized() error
	// Lock closes the plaintext view. Locking storage that is not unlocked is not an error.
	Lock(ctx context.Context) error
}

// NewRandomKey returns a key for a fresh node's storage.
func NewRandomKey() ([]byte, error) {
	key := make([]byte, KeySize)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("random state key: %w", err)
	}
	return key, nil
}

var uuidPattern = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// ValidUUID reports whether s is a lower-case UUID in 8-4-4-4-12 form.
func ValidUUID(s string) bool { return uuidPattern.MatchString(s) }

func checkKey(key []byte) error {
	if len(key) != KeySize {
		return fmt.Errorf("state key of %d bytes, want %d", len(key), KeySize)
	}
	return nil
}
