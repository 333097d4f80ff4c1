package snp

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/openconstellation/constellation/pkg/strictjson"
)

// Reference is what an SEV-SNP report must show to be accepted: the hardware block of the
// attestation config for SEV-SNP variants. The zero value of every field is the strict
// choice, except where the field says otherwise; Validate refuses a reference that would
// accept any launch (no measurement and no enforced ID key) or any firmware (a product line
// without a minimum TCB).
type Reference struct {
	// Name identifies the reference in results and logs.
	Name string `json:"name"`
	// Products lists the accepted product lines ("Milan", "Genoa", "Turin"); empty means all
	// of them. Only the pinned roots of these lines are trusted.
	Products []string `json:"products,omitempty"`
	// MinimumTCB is the lowest firmware each product line may run, by product line: TCB
	// component numbers are per product line (a Milan microcode level means nothing on
	// Genoa). Every accepted product line needs an entry. It is enforced on the report's
	// COMMITTED_TCB (the firmware cannot be rolled back below it), LAUNCH_TCB (the VM was not
	// launched on older firmware) and REPORTED_TCB (the TCB of the VCEK/VLEK that signed:
	// older firmware can derive the key of an older TCB, so a key of vulnerable firmware must
	// not vouch for anything). CURRENT_TCB is not compared: it may be ahead of the committed
	// TCB while new firmware is provisional.
	MinimumTCB map[string]TCB `json:"minimumTCB"`
	// GuestPolicy are the requirements on the report's guest policy.
	GuestPolicy GuestPolicy `json:"guestPolicy"`
	// VMPL is the privilege level the report must have been requested from; default 0 (the
	// most privileged: a report requested at VMPL 0 by the paravisor or the guest kernel,
	// not by software running below them).
	VMPL uint32 `json:"vmpl"`
	// Measurements are the accepted launch measurements (MEASUREMENT, 48 bytes as hex), one
	// value or a list.
	Measurements Digests `json:"measurement,omitempty"`
	// IDKeyDigests are accepted digests of the ID key or the author key that signed the
	// VM's ID block (48 bytes as hex): a platform that measures firmware it updates on its
	// own signs the firmware's ID block instead (Azure, for example).
	IDKeyDigests Digests `json:"idKeyDigests,omitempty"`
	// IDKeyEnforcement is "equal" (default: a report whose keys are not listed is refused) or
	// "warn-only" (accepted with a warning).
	IDKeyEnforcement string `json:"idKeyEnforcement,omitempty"`
	// PlatformInfo are the requirements on the report's PLATFORM_INFO.
	PlatformInfo PlatformInfo `json:"platformInfo"`
	// MinimumFirmware is the lowest SEV firmware API version accepted, compared with the
	// committed version; nil accepts any.
	MinimumFirmware *FirmwareVersion `json:"minimumFirmware,omitempty"`
}

// ID key enforcement modes.
const (
	EnforceEqual    = "equal"
	EnforceWarnOnly = "warn-only"
)

// TCB is a set of security patch levels of AMD firmware.
type TCB struct {
	// FMC is the security patch level of the firmware's first mutable code (Turin and later;
	// must be 0 on earlier product lines, which have no such component).
	FMC        uint8 `json:"fmc,omitempty"`
	Bootloader uint8 `json:"bootloader"`
	TEE        uint8 `json:"tee"`
	SNP        uint8 `json:"snp"`
	Microcode  uint8 `json:"microcode"`
}

// GuestPolicy are requirements on the guest policy the VM was launched with. Debugging is
// never accepted: a debuggable guest's memory can be read and written by the host.
type GuestPolicy struct {
	// AllowMigrationAgent accepts guests that may be migrated by a migration agent (which
	// can read the guest's memory); default refused.
	AllowMigrationAgent bool `json:"allowMigrationAgent,omitempty"`
	// MinimumABIMajor and MinimumABIMinor are the lowest SNP ABI version the policy may
	// require of the firmware.
	MinimumABIMajor uint8 `json:"minimumABIMajor,omitempty"`
	MinimumABIMinor uint8 `json:"minimumABIMinor,omitempty"`
	// ForbidSMT refuses guests whose policy allows simultaneous multithreading. SMT exposes
	// a guest to sibling-thread side channels, but every public cloud enables it, so it is
	// allowed unless set.
	ForbidSMT bool `json:"forbidSMT,omitempty"`
}

// PlatformInfo are requirements on the host platform the report describes.
type PlatformInfo struct {
	// RequireTSME refuses hosts without transparent memory encryption of all memory.
	RequireTSME bool `json:"requireTSME,omitempty"`
	// ForbidSMT refuses hosts with SMT enabled.
	ForbidSMT bool `json:"forbidSMT,omitempty"`
}

// FirmwareVersion is an SEV firmware API version.
type FirmwareVersion struct {
	Major uint8 `json:"major"`
	Minor uint8 `json:"minor"`
}

// String returns "major.minor".
func (v FirmwareVersion) String() string { return fmt.Sprintf("%d.%d", v.Major, v.Minor) }

// digestSize is the size of MEASUREMENT, ID_KEY_DIGEST and AUTHOR_KEY_DIGEST (SHA-384).
const digestSize = 48

// Digests is a list of byte strings written in JSON as one hex string or a list of them.
type Digests [][]byte

// UnmarshalJSON accepts "hex" or ["hex", ...].
func (d *Digests) UnmarshalJSON(data []byte) error {
	var list []string
	if trimmed := bytes.TrimSpace(data); len(trimmed) > 0 && trimmed[0] == '"' {
		var one string
		if err := strictjson.Unmarshal(data, &one); err != nil {
			return err
		}
		list = []string{one}
	} else if err := strictjson.Unmarshal(data, &list); err != nil {
		return err
	}
	out := make(Digests, 0, len(list))
	for i, s := range list {
		b, err := hex.DecodeString(s)
		if err != nil {
			return fmt.Errorf("value %d: %w", i, err)
		}
		out = append(out, b)
	}
	*d = out
	return nil
}

// MarshalJSON writes a list of hex strings.
func (d Digests) MarshalJSON() ([]byte, error) {
	list := make([]string, 0, len(d))
	for _, b := range d {
		list = append(list, hex.EncodeToString(b))
	}
	return json.Marshal(list)
}

func (d Digests) contains(b []byte) bool {
	return slices.ContainsFunc(d, func(x []byte) bool { return bytes.Equal(x, b) })
}

// DefaultReference returns a reference with the defaults filled in (all product lines, VMPL 0,
// ID keys enforced). It does not validate: the measurements (or ID key digests) and the
// minimum TCB of every product line must still be set.
func DefaultReference(name string) Reference {
	return Reference{
		Name:             name,
		Products:         slices.Clone(ProductLines),
		MinimumTCB:       map[string]TCB{},
		IDKeyEnforcement: EnforceEqual,
	}
}

// withDefaults returns r with empty optional fields set to their defaults.
func (r Reference) withDefaults() Reference {
	if len(r.Products) == 0 {
		r.Products = slices.Clone(ProductLines)
	}
	if r.IDKeyEnforcement == "" {
		r.IDKeyEnforcement = EnforceEqual
	}
	return r
}

// Validate checks the reference, naming the first field that is wrong.
func (r Reference) Validate() error {
	r = r.withDefaults()
	if strings.TrimSpace(r.Name) == "" {
		return errors.New("name: empty")
	}
	seen := map[string]bool{}
	for i, p := range r.Products {
		if !slices.Contains(ProductLines, p) {
			return fmt.Errorf("products[%d]: unknown product line %q, want one of %s", i, p, strings.Join(ProductLines, ", "))
		}
		if seen[p] {
			return fmt.Errorf("products[%d]: %q listed twice", i, p)
		}
		seen[p] = true
	}
	for _, p := range r.Products {
		tcb, ok := r.MinimumTCB[p]
		if !ok {
			return fmt.Errorf("minimumTCB.%s: missing (every accepted product line needs a minimum)", p)
		}
		if p != Turin && tcb.FMC != 0 {
			return fmt.Errorf("minimumTCB.%s.fmc: %s firmware has no FMC component", p, p)
		}
		if err := tcb.check(); err != nil {
			return fmt.Errorf("minimumTCB.%s.%w", p, err)
		}
	}
	// In order, so the first problem named is always the same one.
	for _, p := range slices.Sorted(maps.Keys(r.MinimumTCB)) {
		if !seen[p] {
			return fmt.Errorf("minimumTCB.%s: product line not accepted by products", p)
		}
	}
	if r.VMPL > 3 {
		return fmt.Errorf("vmpl: %d, want 0..3", r.VMPL)
	}
	for i, m := range r.Measurements {
		if len(m) != digestSize {
			return fmt.Errorf("measurement[%d]: %d bytes, want %d", i, len(m), digestSize)
		}
	}
	for i, m := range r.IDKeyDigests {
		if len(m) != digestSize {
			return fmt.Errorf("idKeyDigests[%d]: %d bytes, want %d", i, len(m), digestSize)
		}
	}
	switch r.IDKeyEnforcement {
	case EnforceEqual, EnforceWarnOnly:
	default:
		return fmt.Errorf("idKeyEnforcement: %q, want %q or %q", r.IDKeyEnforcement, EnforceEqual, EnforceWarnOnly)
	}
	if r.IDKeyEnforcement == EnforceWarnOnly && len(r.IDKeyDigests) == 0 {
		return errors.New("idKeyEnforcement: warn-only without idKeyDigests")
	}
	if len(r.Measurements) == 0 && (len(r.IDKeyDigests) == 0 || r.IDKeyEnforcement != EnforceEqual) {
		return errors.New("measurement: at least one accepted value is required (or idKeyDigests enforced \"equal\"), or any launched image would be accepted")
	}
	return nil
}

func (t TCB) check() error {
	// The SNP ABI allows 0..127 for every component but microcode.
	for _, c := range []struct {
		name  string
		value uint8
	}{{"fmc", t.FMC}, {"bootloader", t.Bootloader}, {"tee", t.TEE}, {"snp", t.SNP}} {
		if c.value > 127 {
			return fmt.Errorf("%s: %d, want 0..127", c.name, c.value)
		}
	}
	return nil
}

// TCBFromVersion decomposes a TCB_VERSION of a product line. Turin moved the fields to make
// room for FMC: Milan and Genoa have bootloader, TEE, SNP and microcode in bytes 0, 1, 6 and
// 7; Turin has FMC, bootloader, TEE and SNP in bytes 0..3 and microcode in byte 7.
func TCBFromVersion(product string, v uint64) TCB {
	b := func(i int) uint8 { return uint8(v >> (8 * i)) }
	if product == Turin {
		return TCB{FMC: b(0), Bootloader: b(1), TEE: b(2), SNP: b(3), Microcode: b(7)}
	}
	return TCB{Bootloader: b(0), TEE: b(1), SNP: b(6), Microcode: b(7)}
}

// Version composes the TCB_VERSION of a product line.
func (t TCB) Version(product string) uint64 {
	if product == Turin {
		return uint64(t.FMC) | uint64(t.Bootloader)<<8 | uint64(t.TEE)<<16 | uint64(t.SNP)<<24 | uint64(t.Microcode)<<56
	}
	return uint64(t.Bootloader) | uint64(t.TEE)<<8 | uint64(t.SNP)<<48 | uint64(t.Microcode)<<56
}

// below returns the first component of t below min, or "" if none is.
func (t TCB) below(minimum TCB) (component string, got, want uint8) {
	for _, c := range []struct {
		name      string
		got, want uint8
	}{
		{"fmc", t.FMC, minimum.FMC},
		{"bootloader", t.Bootloader, minimum.Bootloader},
		{"tee", t.TEE, minimum.TEE},
		{"snp", t.SNP, minimum.SNP},
		{"microcode", t.Microcode, minimum.Microcode},
	} {
		if c.got < c.want {
			return c.name, c.got, c.want
		}
	}
	return "", 0, 0
}

// String describes the TCB for humans.
func (t TCB) String() string {
	s := fmt.Sprintf("bootloader %d, tee %d, snp %d, microcode %d", t.Bootloader, t.TEE, t.SNP, t.Microcode)
	if t.FMC != 0 {
		s = fmt.Sprintf("fmc %d, ", t.FMC) + s
	}
	return s
}
