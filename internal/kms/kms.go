// Package kms holds the key hierarchy of a cluster (docs/design.md "2. Keys", the contract
// between components): the master secret, HKDF-SHA256 derivation of every other key from it, the
// measurement secret, the cluster ID, and the PCR 15 value that marks an initialized node.
package kms

import (
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/openconstellation/constellation/internal/csidriver"
	"github.com/openconstellation/constellation/internal/fileutil"
	"github.com/openconstellation/constellation/internal/statedisk"
	"github.com/openconstellation/constellation/pkg/strictjson"
	"github.com/openconstellation/constellation/pkg/untrusted"
)

// Sizes of the master secret parts and of derived secrets.
const (
	MasterKeySize  = 32
	MasterSaltSize = 32
	DerivedKeySize = 32
	MaxDerivedSize = 255 * sha256.Size // HKDF-SHA256 output limit
	MeasurementID  = "measurementSecret"
	// VolumeKeyPrefix starts the key id of an encrypted volume's key: "volume-" + the
	// volume's id (csidriver.IDFor).
	VolumeKeyPrefix = "volume-"
	clusterIDInfo   = "key-clusterID"
	derivedKeyLabel = "key-"
)

// MasterSecret is the root of all cluster keys. The CLI generates it and keeps it in
// constellation-mastersecret.json; nodes receive it only over the attested channel.
type MasterSecret struct {
	Key  []byte `json:"key"`
	Salt []byte `json:"salt"`
}

// NewMasterSecret returns a fresh random master secret.
func NewMasterSecret() (MasterSecret, error) {
	m := MasterSecret{Key: make([]byte, MasterKeySize), Salt: make([]byte, MasterSaltSize)}
	if _, err := rand.Read(m.Key); err != nil {
		return MasterSecret{}, err
	}
	if _, err := rand.Read(m.Salt); err != nil {
		return MasterSecret{}, err
	}
	return m, nil
}

// Validate checks the sizes of the master secret.
func (m MasterSecret) Validate() error {
	var problems []error
	if len(m.Key) != MasterKeySize {
		problems = append(problems, fmt.Errorf("master secret: key has %d bytes, want %d", len(m.Key), MasterKeySize))
	}
	if len(m.Salt) != MasterSaltSize {
		problems = append(problems, fmt.Errorf("master secret: salt has %d bytes, want %d", len(m.Salt), MasterSaltSize))
	}
	return errors.Join(problems...)
}

// DeriveKey derives the key with the given id: HKDF-SHA256(IKM = master key, salt = master
// salt, info = "key-" + id, length bytes).
func (m MasterSecret) DeriveKey(id string, length int) ([]byte, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return derive(m.Key, m.Salt, derivedKeyLabel+id, length)
}

// StateDiskKey derives the key of the state disk with the given UUID: the derived key whose id
// is the UUID in lower case, statedisk.KeySize bytes (docs/design.md "2.2 Derived keys"). It is
// the one home of a disk key's derivation: the init node, `constellation recover` and the tests
// call it, and the key service computes the same bytes when the join service asks it for the
// disk's id and statedisk.KeySize. Callers pass the canonical, lower-case UUID.
func (m MasterSecret) StateDiskKey(diskUUID string) ([]byte, error) {
	return m.DeriveKey(diskUUID, statedisk.KeySize)
}

// VolumeKey derives the key of the encrypted volume with the given id (csidriver.IDFor): the
// derived key whose id is VolumeKeyID(id), DerivedKeySize bytes (docs/design.md "2.2 Derived
// keys"). It is the one home of a volume key's derivation: the key service computes the same
// bytes when the join service asks it for VolumeKeyID(id) and DerivedKeySize. An id not of
// csidriver.IDFor's form is refused, so no other id space (a state disk's UUID, the
// measurement secret) can be reached through it.
func (m MasterSecret) VolumeKey(id string) ([]byte, error) {
	keyID, err := VolumeKeyID(id)
	if err != nil {
		return nil, err
	}
	return m.DeriveKey(keyID, DerivedKeySize)
}

// VolumeKeyID is the key id of the volume with the given id: VolumeKeyPrefix + id, for ids of
// csidriver.IDFor's form only.
func VolumeKeyID(id string) (string, error) {
	if !csidriver.ValidID(id) {
		return "", fmt.Errorf("volume id %s is not of the form vol-<32 lower-case hex digits>", untrusted.Quote(id))
	}
	return VolumeKeyPrefix + id, nil
}

// IsVolumeKeyID reports whether keyID is the key id of a volume (VolumeKeyID of a valid id).
func IsVolumeKeyID(keyID string) bool {
	id, ok := strings.CutPrefix(keyID, VolumeKeyPrefix)
	return ok && csidriver.ValidID(id)
}

// MeasurementSecret derives the measurement secret that, with the measurement salt,
// determines the cluster ID.
func (m MasterSecret) MeasurementSecret() ([]byte, error) {
	return m.DeriveKey(MeasurementID, DerivedKeySize)
}

// ClusterID is HKDF-SHA256(IKM = measurement secret, salt = measurement salt,
// info = "key-clusterID", 32 bytes).
func ClusterID(measurementSecret, measurementSalt []byte) ([]byte, error) {
	if len(measurementSecret) == 0 || len(measurementSalt) == 0 {
		return nil, errors.New("cluster ID: measurement secret and salt must not be empty")
	}
	return derive(measurementSecret, measurementSalt, clusterIDInfo, 32)
}

func derive(ikm, salt []byte, info string, length int) ([]byte, error) {
	if length <= 0 || length > MaxDerivedSize {
		return nil, fmt.Errorf("derived key length %d out of range 1..%d", length, MaxDerivedSize)
	}
	return hkdf.Key(sha256.New, ikm, salt, info, length)
}

// WriteMasterSecretFile writes m as JSON to path with mode 0600 and fsyncs it (and its
// directory) before returning, so the secret is durable before it is ever sent to a node. An
// existing file is never overwritten.
func WriteMasterSecretFile(path string, m MasterSecret) error {
	if err := m.Validate(); err != nil {
		return err
	}
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	// Written to a 0600 temporary file and linked into place (fileutil.CreateAtomic): a
	// crash never leaves a torn secret that a retry would refuse to replace, and a file or
	// symlink planted at the name is refused, never followed.
	if err := fileutil.CreateAtomic(path, append(data, '\n'), 0o600); err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("master secret file %s exists: refusing to overwrite it: %w", path, os.ErrExist)
		}
		return fmt.Errorf("creating master secret file: %w", err)
	}
	return nil
}

// ReadMasterSecretFile reads and validates a master secret file.
func ReadMasterSecretFile(path string) (MasterSecret, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return MasterSecret{}, fmt.Errorf("reading master secret: %w", err)
	}
	var m MasterSecret
	if err := strictjson.Unmarshal(data, &m); err != nil {
		return MasterSecret{}, fmt.Errorf("master secret file %s: %w", path, err)
	}
	if err := m.Validate(); err != nil {
		return MasterSecret{}, fmt.Errorf("master secret file %s: %w", path, err)
	}
	return m, nil
}
