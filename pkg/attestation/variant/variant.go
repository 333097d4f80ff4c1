// Package variant is the registry of attestation variants: the kinds of evidence Constellation
// can issue and validate. A variant has a stable name (used in configs, on the wire and in
// logs), a stable configuration key (the key of its block under attestation in
// constellation-conf.yaml) and an OID (a stable binary identifier, kept compatible with the archived upstream's
// numbering so that evidence and configs stay recognisable).
package variant

import (
	"crypto/sha256"
	"crypto/sha512"
	"encoding/asn1"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Variant identifies one kind of attestation evidence and carries the facts of it that do
// not depend on an implementation: its name, OID and registers. Variants are comparable
// values (==, map keys): every field is. What Constellation does with a variant (its
// hardware block, how its attestation key is trusted, its issuer and validator) is its entry
// in pkg/attestation/choose (BuiltIns).
type Variant struct {
	name string
	// configKey is the key of the variant's block under attestation in
	// constellation-conf.yaml ("qemuVTPM"): the file's schema names each variant by it, so it
	// is as stable as name.
	configKey string
	// oid is the dotted object identifier (a string, so that Variant stays comparable).
	oid string
	// registerLen is the byte length of one measurement register of this variant
	// (32 for the SHA-256 PCR bank of a TPM, 48 for SNP/TDX registers).
	registerLen int
	// registerCount is the number of registers: valid indices are [0, registerCount).
	registerCount uint32
	// registerName is how a register is named in messages ("PCR", "RTMR").
	registerName string
	// imageRegisters is what the variant's images measure at boot: registers
	// [0, imageRegisters), every one of which a reference set must enforce.
	imageRegisters uint32
	// clusterIDRegister carries the cluster-ID marker instead: it is extended at init/join,
	// so its value belongs to one cluster and is checked against the cluster ID, never by
	// reference values.
	clusterIDRegister uint32
}

// The variants Constellation knows, one literal each: name, configuration key, OID, register
// length, count and name, then the register map of its images (registers below the first number are measured
// at boot, the second carries the cluster-ID marker). The map of each:
//
//   - qemu-vtpm, the local provider's images (docs/attestation.md): PCRs 0..14 each hold an
//     image measurement (11 the bootstrapper, 12 the node configuration, the others zero,
//     which a set must still pin: a nonzero value there means something else booted), PCR 15
//     the cluster-ID marker. PCRs 16..23 are resettable or extendable by software at run time
//     and measure nothing of the image.
//   - The cloud vTPM variants (azure-*, aws-*, gcp-*) boot the same image layout on the
//     cloud's vTPM: PCRs 0..14 (firmware and boot chain as the cloud's firmware measures them,
//     then the image's own), PCR 15 the cluster-ID marker.
//   - qemu-tdx (pkg/attestation/tdx): register 0 is MRTD (the TD's initial memory: the
//     virtual firmware), registers 1..3 are RTMR0..2 (firmware configuration, then the kernel
//     and boot loader, then the kernel command line and initrd, as TDVF and the kernel extend
//     them). Register 4 is RTMR3, which no firmware or kernel extends: it carries the
//     cluster-ID marker.
var (
	QEMUVTPM           = Variant{"qemu-vtpm", "qemuVTPM", "1.3.9900.5.1", 32, 24, "PCR", 15, 15}
	QEMUTDX            = Variant{"qemu-tdx", "qemuTDX", "1.3.9900.5.99", 48, 5, "TDX register", 4, 4}
	AWSNitroTPM        = Variant{"aws-nitro-tpm", "awsNitroTPM", "1.3.9900.1.1", 32, 24, "PCR", 15, 15}
	AWSSEVSNP          = Variant{"aws-sev-snp", "awsSEVSNP", "1.3.9900.1.2", 32, 24, "PCR", 15, 15}
	GCPSEVES           = Variant{"gcp-sev-es", "gcpSEVES", "1.3.9900.2.1", 32, 24, "PCR", 15, 15}
	GCPSEVSNP          = Variant{"gcp-sev-snp", "gcpSEVSNP", "1.3.9900.2.2", 32, 24, "PCR", 15, 15}
	AzureSEVSNP        = Variant{"azure-sev-snp", "azureSEVSNP", "1.3.9900.4.1", 32, 24, "PCR", 15, 15}
	AzureTrustedLaunch = Variant{"azure-trustedlaunch", "azureTrustedLaunch", "1.3.9900.4.2", 32, 24, "PCR", 15, 15}
	AzureTDX           = Variant{"azure-tdx", "azureTDX", "1.3.9900.4.3", 32, 24, "PCR", 15, 15}
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

// ConfigKey returns the key of the variant's block under attestation in
// constellation-conf.yaml, for example "qemuVTPM" (docs/configuration.md).
func (v Variant) ConfigKey() string { return v.configKey }

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

// ImageRegisters returns, in ascending order, the registers the images of v measure: a
// reference set for v must enforce every one of them and may name no other. Nil for the
// zero Variant, whose sets cannot be checked.
func (v Variant) ImageRegisters() []uint32 {
	if v.IsZero() {
		return nil
	}
	out := make([]uint32, 0, v.imageRegisters)
	for i := range v.imageRegisters {
		out = append(out, i)
	}
	return out
}

// ClusterIDRegister returns the register that carries the cluster-ID marker of v (false for
// the zero Variant): it is set at init/join, so a reference set must never include it.
func (v Variant) ClusterIDRegister() (uint32, bool) {
	return v.clusterIDRegister, !v.IsZero()
}

// ClusterIDMarker returns the value of v's cluster-ID register on a node that extended
// clusterID once into the reset register (ClusterIDMarkerOf with v's register length).
func (v Variant) ClusterIDMarker(clusterID []byte) []byte {
	return ClusterIDMarkerOf(v.registerLen, clusterID)
}

// ClusterIDMarkerOf returns the cluster-ID marker of a register of registerLen bytes:
// H(0^n || H(clusterID)) with the register's hash, SHA-256 for a 32-byte PCR, SHA-384 for a
// 48-byte TDX RTMR. Nil for any other size: no marker can match.
func ClusterIDMarkerOf(registerLen int, clusterID []byte) []byte {
	switch registerLen {
	case sha256.Size:
		digest := sha256.Sum256(clusterID)
		m := sha256.Sum256(append(make([]byte, sha256.Size), digest[:]...))
		return m[:]
	case sha512.Size384:
		digest := sha512.Sum384(clusterID)
		m := sha512.Sum384(append(make([]byte, sha512.Size384), digest[:]...))
		return m[:]
	}
	return nil
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
