package keyservice

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/openconstellation/constellation/internal/kms"
	"github.com/openconstellation/constellation/pkg/strictjson"
)

// Policy authorizes callers, named by the common name of their client certificate, for key
// ids. Upstream's key service answered anyone who could reach it; ours answers only the
// callers listed here, and only for their ids (docs/design.md "1.9 The key service answers
// only whom it must").
//
// JSON form (the key service's policy file):
//
//	{"clients": {"joinservice": {"keyIDPrefixes": ["measurementSecret"], "stateDiskKeys": true, "volumeKeys": true}}}
type Policy struct {
	Clients map[string]Grant `json:"clients"`
}

// Grant is what one caller may derive.
type Grant struct {
	// KeyIDPrefixes: the caller may derive any id that starts with one of these.
	KeyIDPrefixes []string `json:"keyIDPrefixes"`
	// StateDiskKeys: the caller may derive state-disk keys, whose ids are lower-case UUIDs
	// (docs/design.md "2.2 Derived keys"). A prefix cannot express "any UUID", and no other
	// id looks like one.
	StateDiskKeys bool `json:"stateDiskKeys"`
	// VolumeKeys: the caller may derive the keys of encrypted volumes, whose ids are
	// "volume-" and a volume id (kms.VolumeKeyID). Only this grant reaches them: a prefix
	// that could match a volume key id is refused (Validate), so that whoever reads the
	// policy sees every caller of volume keys by this one field.
	VolumeKeys bool `json:"volumeKeys"`
}

// JoinServiceClient is the join service's name in the policy: the common name of its client
// certificate.
const JoinServiceClient = "joinservice"

// DefaultPolicy grants the join service what it derives: the measurement secret, state-disk
// keys and volume keys (it releases each only to the node it belongs to: docs/joinservice.md,
// "Keys follow identity" and "Volume keys"). No other caller exists.
func DefaultPolicy() Policy {
	return Policy{Clients: map[string]Grant{
		JoinServiceClient: {KeyIDPrefixes: []string{kms.MeasurementID}, StateDiskKeys: true, VolumeKeys: true},
	}}
}

var (
	keyIDPattern = regexp.MustCompile(`\A[A-Za-z0-9][A-Za-z0-9._:-]{0,127}\z`)
	uuidPattern  = regexp.MustCompile(`\A[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\z`)
)

// ValidKeyID reports why id is not a valid key id: 1..128 characters of [A-Za-z0-9._:-],
// starting with a letter or digit. Ids end up in HKDF's info and in logs, so they are kept
// printable and short.
func ValidKeyID(id string) error {
	if !keyIDPattern.MatchString(id) {
		return fmt.Errorf("key id %q: must be 1..128 characters of [A-Za-z0-9._:-], starting with a letter or digit", id)
	}
	return nil
}

// IsStateDiskKeyID reports whether id is a state-disk key id (a lower-case UUID).
func IsStateDiskKeyID(id string) bool { return uuidPattern.MatchString(id) }

// Allows reports whether client may derive id.
func (p Policy) Allows(client, id string) bool {
	g, ok := p.Clients[client]
	if !ok {
		return false
	}
	if g.StateDiskKeys && IsStateDiskKeyID(id) {
		return true
	}
	if kms.IsVolumeKeyID(id) {
		// Volume keys only by their own grant, whatever the prefixes say (Validate refuses
		// such prefixes; this holds for a Policy built without it too).
		return g.VolumeKeys
	}
	for _, prefix := range g.KeyIDPrefixes {
		if strings.HasPrefix(id, prefix) {
			return true
		}
	}
	return false
}

// Validate checks that every client has a name and grants something, and that no prefix is
// empty (which would grant every id; list the ids instead).
func (p Policy) Validate() error {
	if len(p.Clients) == 0 {
		return fmt.Errorf("policy: no clients")
	}
	for name, g := range p.Clients {
		if name == "" {
			return fmt.Errorf("policy: client with empty name")
		}
		if len(g.KeyIDPrefixes) == 0 && !g.StateDiskKeys && !g.VolumeKeys {
			return fmt.Errorf("policy: client %q is granted nothing", name)
		}
		for i, prefix := range g.KeyIDPrefixes {
			if prefix == "" {
				return fmt.Errorf("policy: client %q: keyIDPrefixes[%d] is empty (it would grant every key id)", name, i)
			}
			if strings.HasPrefix(kms.VolumeKeyPrefix, prefix) || strings.HasPrefix(prefix, kms.VolumeKeyPrefix) {
				return fmt.Errorf("policy: client %q: keyIDPrefixes[%d] %q could match volume key ids (%q...): grant them with volumeKeys", name, i, prefix, kms.VolumeKeyPrefix)
			}
		}
	}
	return nil
}

// ParsePolicy decodes and validates a policy (strictjson.Unmarshal: unknown fields, a field
// twice or in other letter case, and trailing data are errors).
func ParsePolicy(data []byte) (Policy, error) {
	var p Policy
	if err := strictjson.Unmarshal(data, &p); err != nil {
		return Policy{}, fmt.Errorf("policy: %w", err)
	}
	return p, p.Validate()
}
