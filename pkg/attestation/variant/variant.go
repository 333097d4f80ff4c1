// Package variant is the registry of attestation variants: the kinds of evidence Constellation
// can issue and validate. A variant has a stable name (used in configs, on the wire and in
// logs) and an OID (a stable binary identifier, kept compatible with the archived upstream's
// numbering so that evidence and configs stay recognisable).
package variant

import (
	"encoding/asn1"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Variant identifies one kind of attestation evidence. Variants are comparable values (==,
// map keys): every field is.
type Variant struct {
	name string
	// oid is the dotted object identifier (a string, so that Variant stays comparable).
	oid string
	// registerLen is the byte length of one measurement register of this variant
	// (32 for the SHA-256 PCR bank of a TPM, 48 for SNP/TDX registers).
	registerLen int
	// registerCount is the number of registers: valid indices are [0, registerCount).
	registerCount uint32
	// registerName is how a register is named in messages ("PCR", "RTMR").
	registerName string
}

// The variants Constellation knows. Only those with an Issuer/Validator implementation can be
// used; the others are registered so configs naming them get a precise "not implemented" error
// rather than "unknown variant".
var (
	QEMUVTPM           = Variant{"qemu-vtpm", "1.3.9900.5.1", 32, 24, "PCR"}
	QEMUTDX            = Variant{"qemu-tdx", "1.3.9900.5.99", 48, 5, "TDX register"}
	AWSNitroTPM        = Variant{"aws-nitro-tpm", "1.3.9900.1.1", 32, 24, "PCR"}
	AWSSEVSNP          = Variant{"aws-sev-snp", "1.3.9900.1.2", 32, 24, "PCR"}
	GCPSEVES           = Variant{"gcp-sev-es", "1.3.9900.2.1", 32, 24, "PCR"}
	GCPSEVSNP          = Variant{"gcp-sev-snp", "1.3.9900.2.2", 32, 24, "PCR"}
	AzureSEVSNP        = Variant{"azure-sev-snp", "1.3.9900.4.1", 32, 24, "PCR"}
	AzureTrustedLaunch = Variant{"azure-trustedlaunch", "1.3.9900.4.2", 32, 24, "PCR"}
	AzureTDX           = Variant{"azure-tdx", "1.3.9900.4.3", 32, 24, "PCR"}
)

var all = []Variant{QEMUVTPM, QEMUTDX, AWSNitroTPM, AWSSEVSNP, GCPSEVES, GCPSEVSNP, AzureSEVSNP, AzureTrustedLaunch, AzureTDX}

// All returns every registered variant, sorted by name.
func All() []Variant {
	out := append([]Variant(nil), all...)
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// FromString returns the variant with the given name.
func FromString(name string) (Variant, error) {
	for _, v := range all {
		if v.name == name {
			return v, nil
		}
	}
	names := make([]string, 0, len(all))
	for _, v := range All() {
		names = append(names, v.name)
	}
	return Variant{}, fmt.Errorf("unknown attestation variant %q (known: %s)", name, strings.Join(names, ", "))
}

// FromOID returns the variant with the given OID.
func FromOID(oid asn1.ObjectIdentifier) (Variant, error) {
	for _, v := range all {
		if v.oid == oid.String() {
			return v, nil
		}
	}
	return Variant{}, fmt.Errorf("unknown attestation variant OID %s", oid)
}

// String returns the variant's name.
func (v Variant) String() string { return v.name }

// OID returns the variant's object identifier.
func (v Variant) OID() asn1.ObjectIdentifier {
	var oid asn1.ObjectIdentifier
	for part := range strings.SplitSeq(v.oid, ".") {
		n, err := strconv.Atoi(part)
		if err != nil {
			return nil // unreachable: the registered OIDs are constants
		}
		oid = append(oid, n)
	}
	return oid
}

// IsZero reports whether v is the zero Variant (no variant).
func (v Variant) IsZero() bool { return v.name == "" }

// RegisterLen is the byte length of one measurement register.
func (v Variant) RegisterLen() int { return v.registerLen }

// RegisterCount is the number of measurement registers; valid indices are below it.
func (v Variant) RegisterCount() uint32 { return v.registerCount }

// RegisterName names one register for messages, for example "PCR 4".
func (v Variant) RegisterName(idx uint32) string {
	if v.registerName == "" {
		return fmt.Sprintf("register %d", idx)
	}
	return fmt.Sprintf("%s %d", v.registerName, idx)
}

// registerMap is what the images of a variant measure at boot: the registers a reference set
// must enforce, and the register that carries the cluster-ID marker instead (extended at
// init/join, so its value belongs to one cluster and is checked against the cluster ID, never
// by reference values). Only variants with an implementation have one.
type registerMap struct {
	image     []uint32
	clusterID uint32
}

var registerMaps = map[string]registerMap{
	// The local provider's images (docs/attestation.md): PCRs 0..14 each hold an image
	// measurement (11 the bootstrapper, 12 the node configuration, the others zero, which a
	// set must still pin: a nonzero value there means something else booted), PCR 15 the
	// cluster-ID marker. PCRs 16..23 are resettable or extendable by software at run time
	// and measure nothing of the image.
	QEMUVTPM.name: {image: registerRange(0, 15), clusterID: 15},
	// Azure's confidential VMs boot the same image layout on the HCL's vTPM: PCRs 0..14
	// (firmware and boot chain as Azure's firmware measures them, then the image's own),
	// PCR 15 the cluster-ID marker.
	AzureSEVSNP.name: {image: registerRange(0, 15), clusterID: 15},
	AzureTDX.name:    {image: registerRange(0, 15), clusterID: 15},
	// qemu-tdx (pkg/attestation/tdx): register 0 is MRTD (the TD's initial memory: the
	// virtual firmware), registers 1..3 are RTMR0..2 (firmware configuration, then the
	// kernel and boot loader, then the kernel command line and initrd, as TDVF and the
	// kernel extend them). Register 4 is RTMR3, which no firmware or kernel extends: it
	// carries the cluster-ID marker.
	QEMUTDX.name: {image: registerRange(0, 4), clusterID: 4},
	// The SEV-SNP vTPM variants boot the same image layout on the cloud's vTPM: PCRs 0..14
	// (firmware and boot chain as the cloud's firmware measures them, then the image's own),
	// PCR 15 the cluster-ID marker.
	AWSSEVSNP.name: {image: registerRange(0, 15), clusterID: 15},
	GCPSEVSNP.name: {image: registerRange(0, 15), clusterID: 15},
	// The cloud TPM-only variants boot the same image layout on the cloud's vTPM: PCRs
	// 0..14 (firmware and boot chain as the cloud's firmware measures them, then the image's
	// own), PCR 15 the cluster-ID marker.
	AzureTrustedLaunch.name: {image: registerRange(0, 15), clusterID: 15},
	GCPSEVES.name:           {image: registerRange(0, 15), clusterID: 15},
	AWSNitroTPM.name:        {image: registerRange(0, 15), clusterID: 15},
}

func registerRange(from, to uint32) []uint32 {
	out := make([]uint32, 0, to-from)
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}

// ImageRegisters returns, in ascending order, the registers the images of v measure: a
// reference set for v must enforce every one of them and may name no other. Nil means the
// variant's register map is unknown (not implemented), and no reference set can be checked.
func (v Variant) ImageRegisters() []uint32 {
	m, ok := registerMaps[v.name]
	if !ok {
		return nil
	}
	return append([]uint32(nil), m.image...)
}

// ClusterIDRegister returns the register that carries the cluster-ID marker of v, if v has
// one: it is set at init/join, so a reference set must never include it.
func (v Variant) ClusterIDRegister() (uint32, bool) {
	m, ok := registerMaps[v.name]
	return m.clusterID, ok
}

// MarshalText implements encoding.TextMarshaler, so variants appear by name in JSON and YAML.
func (v Variant) MarshalText() ([]byte, error) { return []byte(v.name), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (v *Variant) UnmarshalText(b []byte) error {
	parsed, err := FromString(string(b))
	if err != nil {
		return err
	}
	*v = parsed
	return nil
}
