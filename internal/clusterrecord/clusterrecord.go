// Package clusterrecord is what a cluster records about itself in Kubernetes, in kube-system,
// for its in-cluster services and verifiers (docs/services.md): the names of those objects,
// their data keys, and the formats of their values.
//
//	Secret    constellation-mastersecret   mastersecret.json    kms.MasterSecret (JSON)       init server, immutable
//	ConfigMap constellation-cluster        cluster.json         Cluster (JSON)                init server, immutable
//	ConfigMap constellation-attestation    variant              "qemu-vtpm"                   deploy, updated on upgrades
//	                                       reference-sets.json  measurements.ReferenceSets
//	                                       ak-roots.pem         PEM certificates of the platform's AK CA(s)
//	                                       hardware.json        Hardware (JSON): the variant's snp/tdx block
//	Secret    constellation-keyservice-tls ca.crt, keyservice.{crt,key}, joinservice.{crt,key}   deploy, created once
//
// The first two never change: the cluster ID and the master secret are fixed at init. The
// attestation ConfigMap changes during upgrades (docs/design.md "1.8 Reference values change
// without a gap": add the new reference set, roll the nodes, retire the old set); the join
// service reloads its reference sets from it.
package clusterrecord

import (
	"bytes"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"

	"github.com/openconstellation/constellation/internal/kms"
	"github.com/openconstellation/constellation/internal/pki"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
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
	InitializedPCR15     string      `json:"initializedPCR15"` // hex, what every node's PCR 15 reads
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
	if err := json.Unmarshal(data, &c); err != nil {
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
		if want := hex.EncodeToString(kms.InitializedPCR15(id)); c.InitializedPCR15 != want {
			bad("initialized PCR 15 %q does not follow from the cluster ID (want %s)", c.InitializedPCR15, want)
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

// Attestation is the content of ConfigMap constellation-attestation: the whole
// choose.Reference of the cluster's variant, one part per key.
type Attestation struct {
	Variant       variant.Variant
	ReferenceSets measurements.ReferenceSets
	// AKRootsPEM are the certificates of the platform's AK CA(s).
	AKRootsPEM []byte
	// Hardware is the variant's hardware reference (which SEV-SNP or TDX reports it accepts).
	Hardware Hardware
}

// Hardware is the variant's hardware block (choose.HardwareValues). Its JSON form is the
// record's hardware.json and the init request's hardware field; the keys are the
// configuration file's.
type Hardware = choose.HardwareValues

// ParseHardware decodes hardware.json strictly: an unknown field is an error, so a
// misspelled or misplaced setting (measurements and AK roots have keys of their own) is not
// silently dropped from what nodes are checked against. Empty input is no hardware block
// (records written before the key existed). The block is checked against its variant by
// Attestation.Validate.
func ParseHardware(data []byte) (Hardware, error) {
	if len(data) > MaxSize {
		return Hardware{}, fmt.Errorf("%s: %d bytes, limit %d", HardwareKey, len(data), MaxSize)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return Hardware{}, nil
	}
	// One object and nothing after it (json.Unmarshal refuses trailing data).
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(data, &keys); err != nil {
		return Hardware{}, fmt.Errorf("%s: %w", HardwareKey, err)
	}
	for key, home := range map[string]string{"measurements": ReferenceSetsKey, "akRoots": AKRootsKey} {
		if _, ok := keys[key]; ok {
			return Hardware{}, fmt.Errorf("%s: %q is not a hardware value (it has its own key, %s)", HardwareKey, key, home)
		}
	}
	var h Hardware
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&h); err != nil {
		return Hardware{}, fmt.Errorf("%s: %w", HardwareKey, err)
	}
	return h, nil
}

// Reference returns what evidence is checked against (choose.NewValidator).
func (a Attestation) Reference() choose.Reference {
	return choose.Reference{Variant: a.Variant, Values: choose.Values{
		Measurements: a.ReferenceSets, AKRoots: string(a.AKRootsPEM), HardwareValues: a.Hardware,
	}}
}

// akRootsRequired reports whether variant v trusts a node's attestation key only through
// the configured AK roots: without them, any key could sign its evidence. The other variants
// pin their cloud's roots (used when none are configured), bind the key through the hardware
// report, have no TPM, or opt out explicitly (aws-nitro-tpm, acceptUnauthenticatedAK).
func akRootsRequired(v variant.Variant) bool { return v == variant.QEMUVTPM }

// Validate checks the record as choose.Reference.Validate does for its variant (the variant
// is implemented, the reference sets are of its registers, its hardware block is present and
// valid, no other variant's block is), and the AK roots: required where the variant needs
// them, and wherever given, nothing but CA certificates.
func (a Attestation) Validate() error {
	var problems []error
	if a.Variant.IsZero() {
		problems = append(problems, errors.New("no attestation variant"))
	} else {
		// The AK roots are checked below, by the stricter rules of the record.
		ref := a.Reference()
		ref.AKRoots = ""
		if err := ref.Validate(); err != nil {
			problems = append(problems, err)
		}
	}
	if akRootsRequired(a.Variant) || len(bytes.TrimSpace(a.AKRootsPEM)) > 0 {
		if _, err := ParseAKRoots(a.AKRootsPEM); err != nil {
			problems = append(problems, err)
		}
	}
	if akRootsRequired(a.Variant) && a.Hardware.AcceptUnauthenticatedAK {
		// choose accepts the opt-in for qemu-vtpm instead of roots (tests); a cluster
		// trusts its nodes' keys through the platform's roots only.
		problems = append(problems, fmt.Errorf("acceptUnauthenticatedAK: a %s cluster trusts its nodes' attestation keys through the platform's AK roots only", a.Variant))
	}
	if len(problems) > 0 {
		return fmt.Errorf("invalid attestation configuration: %w", errors.Join(problems...))
	}
	return nil
}

// Data returns the ConfigMap data of a. hardware.json is written for every variant ("{}"
// without a block), so the join service's projection of the keys finds it.
func (a Attestation) Data() (map[string]string, error) {
	if err := a.Validate(); err != nil {
		return nil, err
	}
	sets, err := json.MarshalIndent(a.ReferenceSets, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encoding reference sets: %w", err)
	}
	hw, err := json.MarshalIndent(a.Hardware, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encoding the hardware reference: %w", err)
	}
	return map[string]string{
		VariantKey:       a.Variant.String(),
		ReferenceSetsKey: string(sets) + "\n",
		AKRootsKey:       string(a.AKRootsPEM),
		HardwareKey:      string(hw) + "\n",
	}, nil
}

// ParseAttestation decodes and checks the values of the attestation ConfigMap. hardware may
// be nil: a record written before hardware.json existed has no hardware block, which only
// variants without one accept.
func ParseAttestation(variantName, referenceSets, akRoots, hardware []byte) (Attestation, error) {
	v, err := variant.FromString(string(bytes.TrimSpace(variantName)))
	if err != nil {
		return Attestation{}, err
	}
	if len(referenceSets) > MaxSize {
		return Attestation{}, fmt.Errorf("reference sets of %d bytes, limit %d", len(referenceSets), MaxSize)
	}
	sets, err := measurements.DecodeReferenceSets(referenceSets, v)
	if err != nil {
		return Attestation{}, err
	}
	hw, err := ParseHardware(hardware)
	if err != nil {
		return Attestation{}, err
	}
	if len(akRoots) == 0 {
		akRoots = nil // an empty ConfigMap value is no roots
	}
	a := Attestation{Variant: v, ReferenceSets: sets, AKRootsPEM: akRoots, Hardware: hw}
	if err := a.Validate(); err != nil {
		return Attestation{}, err
	}
	return a, nil
}

// ParseAKRoots returns the pool of the PEM certificates in data: at least one, every PEM
// block a CA certificate, nothing else in the file but whitespace.
func ParseAKRoots(data []byte) (*x509.CertPool, error) {
	if len(data) > MaxSize {
		return nil, fmt.Errorf("AK roots of %d bytes, limit %d", len(data), MaxSize)
	}
	pool, n, err := pki.ParseCAPool(data)
	if err != nil {
		return nil, fmt.Errorf("AK roots: %w", err)
	}
	if n == 0 {
		return nil, errors.New("AK roots: no certificate (the platform's AK CA is required: without it any key could sign evidence)")
	}
	return pool, nil
}
