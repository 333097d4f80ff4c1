// Package clusterrecord is what a cluster records about itself in Kubernetes, in kube-system,
// for its in-cluster services and verifiers (docs/services.md): the names of those objects,
// their data keys, and the formats of their values.
//
//	Secret    constellation-mastersecret   mastersecret.json    kms.MasterSecret (JSON)       init server, immutable
//	ConfigMap constellation-cluster        cluster.json         Cluster (JSON)                init server, immutable
//	ConfigMap constellation-attestation    variant              "qemu-vtpm"                   deploy, updated on upgrades
//	  (one choose.Reference)
//	                                       reference-sets.json  measurements.ReferenceSets
//	                                       ak-roots.pem         PEM certificates of the platform's AK CA(s)
//	                                       hardware.json        choose.HardwareValues (JSON): the variant's snp/tdx block
//	Secret    constellation-keyservice-tls ca.crt, keyservice.{crt,key}, joinservice.{crt,key}   deploy, created once
//
// The first two never change: the cluster ID and the master secret are fixed at init. The
// attestation ConfigMap changes during upgrades (docs/design.md "1.8 Reference values change
// without a gap": add the new reference set, roll the nodes, retire the old set); the join
// service reloads its reference sets from it.
package clusterrecord

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"

	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/strictjson"
)

// Namespace holds every record and the in-cluster services.
const Namespace = "kube-system"

// The master secret (for the key service).
const (
	MasterSecretName = "constellation-mastersecret"
	MasterSecretKey  = "mastersecret.json"
)

// The public facts of the cluster (for the join service and verifiers).
const (
	ClusterConfigMapName = "constellation-cluster"
	ClusterKey           = "cluster.json"
)

// What the join service checks nodes against.
const (
	AttestationConfigMapName = "constellation-attestation"
	VariantKey               = "variant"
	ReferenceSetsKey         = "reference-sets.json"
	AKRootsKey               = "ak-roots.pem"
	HardwareKey              = "hardware.json"
)

// The cluster's registry mirrors (internal/registries), which the join service puts into its
// tickets: written at init from the init request, and by `apply` when the configuration
// changes.
const (
	RegistriesConfigMapName = "constellation-registries"
	RegistryMirrorsKey      = "registry-mirrors.json"
)

// The key service's mutual TLS: a CA made for it alone (its private key is discarded once the
// two leaves are signed), the key service's server pair and the join service's client pair.
const (
	KeyServiceTLSSecretName = "constellation-keyservice-tls"
	KeyServiceCAKey         = "ca.crt"
	KeyServiceCertKey       = "keyservice.crt"
	KeyServiceKeyKey        = "keyservice.key"
	JoinServiceCertKey      = "joinservice.crt"
	JoinServiceKeyKey       = "joinservice.key"
)

// Cluster is the public part of what init records in ConfigMap constellation-cluster (key
// cluster.json).
type Cluster struct {
	Name                 string      `json:"name"`
	ClusterID            string      `json:"clusterID"`       // hex
	MeasurementSalt      string      `json:"measurementSalt"` // base64
	KubernetesVersion    string      `json:"kubernetesVersion"`
	KubernetesComponents []Component `json:"kubernetesComponents,omitempty"`
	// ClusterIDMarker is what every node's cluster-ID register reads (hex): the marker of the
	// cluster's variant (variant.Variant.ClusterIDMarker; PCR 15 of the TPM variants, whence
	// the JSON name, kept for the records of existing clusters).
	ClusterIDMarker string `json:"initializedPCR15"`
}

// Component is one Kubernetes artifact nodes install.
type Component struct {
	Name        string `json:"name"`
	URL         string `json:"url"`
	Hash        string `json:"hash"`
	InstallPath string `json:"installPath"`
}

// MaxSize bounds every record value a service parses (a ConfigMap holds at most 1 MiB).
const MaxSize = 1 << 20

var versionPattern = regexp.MustCompile(`\Av1\.[0-9]+\.[0-9]+\z`)

// IsKubernetesVersion reports whether s has the form of a Kubernetes release, v1.X.Y.
func IsKubernetesVersion(s string) bool { return versionPattern.MatchString(s) }

// ParseCluster decodes and checks a cluster record: unknown fields are ignored (a newer init
// may add some), the known ones must be complete and consistent.
func ParseCluster(data []byte) (Cluster, error) {
	if len(data) > MaxSize {
		return Cluster{}, fmt.Errorf("cluster record of %d bytes, limit %d", len(data), MaxSize)
	}
	var c Cluster
	if err := strictjson.UnmarshalIgnoreUnknown(data, &c); err != nil {
		return Cluster{}, fmt.Errorf("decoding cluster record: %w", err)
	}
	var problems []error
	bad := func(format string, args ...any) { problems = append(problems, fmt.Errorf(format, args...)) }
	if c.Name == "" {
		bad("no name")
	}
	id, err := hex.DecodeString(c.ClusterID)
	if err != nil || len(id) != 32 {
		bad("cluster ID %q is not 32 bytes in hex", c.ClusterID)
	}
	if salt, err := base64.StdEncoding.DecodeString(c.MeasurementSalt); err != nil || len(salt) == 0 {
		bad("measurement salt is not base64 of at least one byte")
	}
	if !versionPattern.MatchString(c.KubernetesVersion) {
		bad("kubernetes version %q is not of the form v1.X.Y", c.KubernetesVersion)
	}
	for i, comp := range c.KubernetesComponents {
		if comp.Name == "" || comp.URL == "" || comp.Hash == "" || comp.InstallPath == "" {
			bad("kubernetes component %d: name, url, hash and install path are required", i)
		}
	}
	if len(id) == 32 {
		if !markerOf(id, c.ClusterIDMarker) {
			bad("cluster-ID marker %q does not follow from the cluster ID in any variant's register", c.ClusterIDMarker)
		}
	}
	if len(problems) > 0 {
		return Cluster{}, fmt.Errorf("invalid cluster record: %w", errors.Join(problems...))
	}
	return c, nil
}

// Salt returns the decoded measurement salt of a parsed record.
func (c Cluster) Salt() []byte {
	salt, _ := base64.StdEncoding.DecodeString(c.MeasurementSalt)
	return salt
}

// ID returns the decoded cluster ID of a parsed record.
func (c Cluster) ID() []byte {
	id, _ := hex.DecodeString(c.ClusterID)
	return id
}

// The attestation ConfigMap is the cluster's choose.Reference, one part per key: the
// reference sets have a key of their own because the join service hot-reloads them
// (measurements.Watcher) while an upgrade rolls the nodes, and the rest is read once at
// start. AttestationData writes a reference into the keys, ParseAttestation reads one back;
// both check it by choose.Reference.ValidateForCluster, so no other shape of it exists.

// AttestationData returns the ConfigMap data of the cluster reference ref. hardware.json is
// written for every variant ("{}" without a block), so the join service's projection of the
// keys finds it.
func AttestationData(ref choose.Reference) (map[string]string, error) {
	if err := validateReference(ref); err != nil {
		return nil, err
	}
	sets, err := json.MarshalIndent(ref.Measurements, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encoding reference sets: %w", err)
	}
	hw, err := json.MarshalIndent(ref.HardwareValues, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encoding the hardware reference: %w", err)
	}
	return map[string]string{
		VariantKey:       ref.Variant.String(),
		ReferenceSetsKey: string(sets) + "\n",
		AKRootsKey:       ref.AKRoots,
		HardwareKey:      string(hw) + "\n",
	}, nil
}

// ParseAttestation decodes and checks the values of the attestation ConfigMap into the
// cluster's reference. hardware may be nil: a record written before hardware.json existed
// has no hardware block, which only variants without one accept.
func ParseAttestation(variantName, referenceSets, akRoots, hardware []byte) (choose.Reference, error) {
	v, err := variant.FromString(string(bytes.TrimSpace(variantName)))
	if err != nil {
		return choose.Reference{}, err
	}
	if len(referenceSets) > MaxSize {
		return choose.Reference{}, fmt.Errorf("reference sets of %d bytes, limit %d", len(referenceSets), MaxSize)
	}
	if len(akRoots) > MaxSize {
		return choose.Reference{}, fmt.Errorf("AK roots of %d bytes, limit %d", len(akRoots), MaxSize)
	}
	sets, err := measurements.DecodeReferenceSets(referenceSets, v)
	if err != nil {
		return choose.Reference{}, err
	}
	hw, err := parseHardware(hardware)
	if err != nil {
		return choose.Reference{}, err
	}
	ref := choose.Reference{Variant: v, Values: choose.Values{Measurements: sets, AKRoots: string(akRoots), HardwareValues: hw}}
	if err := validateReference(ref); err != nil {
		return choose.Reference{}, err
	}
	return ref, nil
}

func validateReference(ref choose.Reference) error {
	if err := ref.ValidateForCluster(); err != nil {
		return fmt.Errorf("invalid attestation configuration: %w", err)
	}
	return nil
}

// parseHardware decodes hardware.json strictly: an unknown field is an error, so a
// misspelled or misplaced setting (measurements and AK roots have keys of their own) is not
// silently dropped from what nodes are checked against. Empty input is no hardware block
// (records written before the key existed). The block is checked against its variant with
// the rest of the reference.
func parseHardware(data []byte) (choose.HardwareValues, error) {
	var none choose.HardwareValues
	if len(data) > MaxSize {
		return none, fmt.Errorf("%s: %d bytes, limit %d", HardwareKey, len(data), MaxSize)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return none, nil
	}
	// One object, each key once, and nothing after it.
	var keys map[string]json.RawMessage
	if err := strictjson.Unmarshal(data, &keys); err != nil {
		return none, fmt.Errorf("%s: %w", HardwareKey, err)
	}
	for key, home := range map[string]string{"measurements": ReferenceSetsKey, "akRoots": AKRootsKey} {
		if _, ok := keys[key]; ok {
			return none, fmt.Errorf("%s: %q is not a hardware value (it has its own key, %s)", HardwareKey, key, home)
		}
	}
	var h choose.HardwareValues
	if err := strictjson.Unmarshal(data, &h); err != nil {
		return none, fmt.Errorf("%s: %w", HardwareKey, err)
	}
	return h, nil
}

// markerOf reports whether marker (hex) is the cluster-ID marker of id in the register of
// some variant: the record does not name its variant (the attestation ConfigMap does), and a
// register's length decides its marker (variant.ClusterIDMarkerOf).
func markerOf(id []byte, marker string) bool {
	for _, v := range variant.All() {
		if _, ok := v.ClusterIDRegister(); ok && hex.EncodeToString(v.ClusterIDMarker(id)) == marker {
			return true
		}
	}
	return false
}
