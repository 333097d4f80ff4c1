// Package measuredboot predicts, from a UKI's bytes, what firmware, systemd-stub and the
// Linux EFI stub measure into a TPM when they boot it (PCRs 4, 9, 11, and the registers
// that stay zero), checks a booted node's TCG event log against that prediction naming the
// first differing event, and builds a node image's full reference values from the
// prediction plus the firmware registers observed once per firmware build
// (docs/measured-boot.md).
//
// The prediction follows what the components do, as upstream Constellation's
// image/measured-boot tool does, for the boot the QEMU provider pins: OVMF starts the UKI
// as the first and only boot option, systemd-stub 252 (Debian bookworm) measures its
// sections and loads the kernel with LoadImage, and the kernel's EFI stub (Linux 6.1)
// measures its command line and initrd.
package measuredboot

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"
	"slices"
	"unicode/utf16"

	"github.com/google/go-eventlog/tcg"
)

// Registers, as the boot components use them (TCG PC Client Platform Firmware Profile;
// systemd's TPM PCR registry; the kernel's EFI stub).
const (
	PCRBootManagerCode = 4  // firmware: boot attempts and the EFI applications it starts
	PCRKernelInitrd    = 9  // Linux EFI stub: command line and initrd
	PCRIMA             = 10 // kernel IMA: boot_aggregate
	PCRKernelImage     = 11 // systemd-stub: the UKI's sections
	PCRClusterID       = 15 // the cluster-ID marker: zero at boot, extended at init/join
)

// FirmwareRegisters are the registers the firmware alone fills from its own code,
// configuration and the VM's hardware: observed once per firmware build and VM shape
// (FirmwareRecord), never predicted. PCR 5 is the firmware's too, but what it measures
// there is the image's partition table: it is predicted from the disk (PredictPCR5).
var FirmwareRegisters = []uint32{0, 1, 2, 3, 6, 7}

// ZeroRegisters are the registers nothing extends in the pinned boot: 8 (no GRUB), 12 and
// 13 (systemd-stub: no credentials, no system extensions, no command line from the boot
// loader), 14 (no shim), and 15 (the cluster-ID marker, before init/join).
var ZeroRegisters = []uint32{8, 12, 13, 14, PCRClusterID}

// Strings the components measure (their digest is SHA-256 of these bytes).
const (
	callingBootOption = "Calling EFI Application from Boot Option"
)

// Event is one predicted measurement: what a component extends into a register, in the
// form a TCG event log records it.
type Event struct {
	PCR    uint32
	Type   tcg.EventType
	Digest [sha256.Size]byte
	// Description says what was measured, for messages.
	Description string
}

func (e Event) String() string {
	return fmt.Sprintf("%s %x (%s)", e.Type.TCGString(), e.Digest, e.Description)
}

// Prediction is what a boot of one UKI extends, per register, in order. A register in it
// with no events is predicted to read zero.
type Prediction struct {
	Events map[uint32][]Event
}

// Registers returns the predicted registers in ascending order.
func (p *Prediction) Registers() []uint32 {
	out := make([]uint32, 0, len(p.Events))
	for r := range p.Events {
		out = append(out, r)
	}
	slices.Sort(out)
	return out
}

// Value replays the predicted events of pcr from the reset value (zero).
func (p *Prediction) Value(pcr uint32) [sha256.Size]byte {
	return replay(p.Events[pcr])
}

func replay(events []Event) [sha256.Size]byte {
	var v [sha256.Size]byte
	for _, e := range events {
		v = extend(v, e.Digest)
	}
	return v
}

func extend(v, digest [sha256.Size]byte) [sha256.Size]byte {
	return sha256.Sum256(append(v[:], digest[:]...))
}

// PredictImage predicts every register a node image's boot sets, firmware apart: the UKI's
// (PredictUKI) and PCR 5 from the boot disk's partition table (PredictPCR5). It is the one
// prediction of an image: the reference values (ReferenceMeasurements) and the firmware
// recording (hack/qemu-firmware) both start from it.
func PredictImage(rawUKI []byte, disk io.ReaderAt) (*Prediction, error) {
	p, err := PredictUKI(rawUKI)
	if err != nil {
		return nil, err
	}
	if p.Events[PCRGPT], err = PredictPCR5(disk); err != nil {
		return nil, err
	}
	return p, nil
}

// PredictUKI parses a UKI and predicts every register its boot sets: 4, 9 and 11 from its
// bytes, and ZeroRegisters as zero.
func PredictUKI(rawUKI []byte) (*Prediction, error) {
	uki, err := ParseUKI(rawUKI)
	if err != nil {
		return nil, err
	}
	p := &Prediction{Events: map[uint32][]Event{}}
	if p.Events[PCRBootManagerCode], err = PredictPCR4(uki); err != nil {
		return nil, err
	}
	if p.Events[PCRKernelInitrd], err = PredictPCR9(uki); err != nil {
		return nil, err
	}
	p.Events[PCRKernelImage] = PredictPCR11(uki)
	for _, r := range ZeroRegisters {
		p.Events[r] = []Event{}
	}
	return p, nil
}

// PredictPCR4 predicts the firmware's PCR 4 when the UKI is the first boot option it tries
// (the QEMU provider pins this: one boot disk with bootindex=1, no other bootable device
// and no option ROMs; docs/measured-boot.md "PCR 4 and the boot order"):
//   - EV_EFI_ACTION "Calling EFI Application from Boot Option" (the boot manager starts a
//     boot option);
//   - EV_SEPARATOR, four zero bytes (end of pre-OS measurements, at ReadyToBoot);
//   - EV_EFI_BOOT_SERVICES_APPLICATION, the Authenticode digest of the UKI (the firmware
//     loads it);
//   - EV_EFI_BOOT_SERVICES_APPLICATION, the Authenticode digest of the .linux section
//     (systemd-stub loads the kernel with the firmware's LoadImage, which measures it).
//
// Every additional boot attempt before the UKI (a DVD drive tried first, a network boot)
// adds events and changes PCR 4.
func PredictPCR4(uki *UKI) ([]Event, error) {
	ukiDigest, err := AuthenticodeSHA256(uki.Raw)
	if err != nil {
		return nil, fmt.Errorf("the UKI's Authenticode digest: %w", err)
	}
	kernelDigest, err := AuthenticodeSHA256(uki.Sections[".linux"])
	if err != nil {
		return nil, fmt.Errorf("the Authenticode digest of the UKI's .linux section: %w", err)
	}
	return []Event{
		{PCR: PCRBootManagerCode, Type: tcg.EFIAction, Digest: sha256.Sum256([]byte(callingBootOption)), Description: callingBootOption},
		{PCR: PCRBootManagerCode, Type: tcg.Separator, Digest: sha256.Sum256(make([]byte, 4)), Description: "separator (end of pre-boot measurements)"},
		{PCR: PCRBootManagerCode, Type: tcg.EFIBootServicesApplication, Digest: ukiDigest, Description: fmt.Sprintf("UKI, Authenticode digest (%d bytes)", len(uki.Raw))},
		{PCR: PCRBootManagerCode, Type: tcg.EFIBootServicesApplication, Digest: kernelDigest, Description: fmt.Sprintf("kernel (.linux section), Authenticode digest (%d bytes)", len(uki.Sections[".linux"]))},
	}, nil
}

// PredictPCR9 predicts what the Linux EFI stub measures into PCR 9, as EV_EVENT_TAG events:
// first its LoadOptions, the command line systemd-stub passes, which is the .cmdline
// section converted to UTF-16LE with its terminating NUL (LOADED_IMAGE::LoadOptions); then
// the initrd it loads over the LINUX_EFI_INITRD_MEDIA (LoadFile2) protocol, the .initrd
// section as it is.
func PredictPCR9(uki *UKI) ([]Event, error) {
	cmdline, err := uki.Cmdline()
	if err != nil {
		return nil, err
	}
	return []Event{
		{PCR: PCRKernelInitrd, Type: tcg.EventTag, Digest: sha256.Sum256(utf16LE(cmdline + "\x00")), Description: fmt.Sprintf("kernel command line %q (LOADED_IMAGE::LoadOptions, UTF-16LE)", cmdline)},
		{PCR: PCRKernelInitrd, Type: tcg.EventTag, Digest: sha256.Sum256(uki.Sections[".initrd"]), Description: fmt.Sprintf("initrd (.initrd section, %d bytes)", len(uki.Sections[".initrd"]))},
	}, nil
}

// PredictPCR11 predicts what systemd-stub 252 measures into PCR 11: for each present
// section in StubSections order, except .pcrsig, an EV_IPL event of the section's name with
// its NUL, then one of the section's data (VirtualSize bytes).
func PredictPCR11(uki *UKI) []Event {
	var events []Event
	for _, name := range StubSections {
		data, ok := uki.Sections[name]
		if !ok || slices.Contains(unmeasuredSections, name) {
			continue
		}
		events = append(events,
			Event{PCR: PCRKernelImage, Type: tcg.Ipl, Digest: sha256.Sum256([]byte(name + "\x00")), Description: fmt.Sprintf("section name %s", name)},
			Event{PCR: PCRKernelImage, Type: tcg.Ipl, Digest: sha256.Sum256(data), Description: fmt.Sprintf("section %s data (%d bytes)", name, len(data))},
		)
	}
	return events
}

// PredictIMA predicts PCR 10 of a kernel with IMA enabled and no IMA policy (Debian's
// kernel: CONFIG_IMA=y, SHA-256, template ima-sig): IMA extends exactly one entry at boot,
// "boot_aggregate", the SHA-256 over PCRs 0..9 (the kernel includes 8 and 9 for banks other
// than SHA-1). The extended digest is the SHA-256 of the template's fields, each preceded
// by its length: d-ng ("sha256:\0" + digest), n-ng ("boot_aggregate\0"), sig (empty).
//
// PCR 10 is not in the firmware's event log (IMA keeps its own), so it is derived from the
// other registers rather than compared event by event.
func PredictIMA(pcr0to9 [10][sha256.Size]byte) Event {
	agg := sha256.New()
	for _, v := range pcr0to9 {
		agg.Write(v[:])
	}
	digestField := append([]byte("sha256:\x00"), agg.Sum(nil)...)
	fields := [][]byte{digestField, []byte("boot_aggregate\x00"), nil}
	tmpl := sha256.New()
	for _, f := range fields {
		_ = binary.Write(tmpl, binary.LittleEndian, uint32(len(f)))
		tmpl.Write(f)
	}
	var d [sha256.Size]byte
	tmpl.Sum(d[:0])
	return Event{PCR: PCRIMA, Type: tcg.Ipl, Digest: d, Description: fmt.Sprintf("IMA boot_aggregate %x (template ima-sig)", digestField[8:])}
}

func utf16LE(s string) []byte {
	u := utf16.Encode([]rune(s))
	out := make([]byte, 2*len(u))
	for i, c := range u {
		binary.LittleEndian.PutUint16(out[2*i:], c)
	}
	return out
}
