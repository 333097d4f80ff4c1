package measuredboot

import (
	"bytes"
	"debug/pe"
	"errors"
	"fmt"
	"strings"
)

// StubSections are the UKI sections systemd-stub 252 knows, in the order it measures them
// into PCR 11 (src/fundamental/tpm-pcr.c, unified_sections; the order is also visible in
// the strings of Debian's linuxx64.efi.stub). It measures every present section except
// .pcrsig, which holds signatures over PCR 11 and so cannot be part of it.
var StubSections = []string{".linux", ".osrel", ".cmdline", ".initrd", ".splash", ".dtb", ".pcrsig", ".pcrpkey"}

// unmeasuredSections are the StubSections systemd-stub does not measure.
var unmeasuredSections = []string{".pcrsig"}

// ErrMalformedUKI is wrapped by every error about a file that is not a UKI whose boot can
// be predicted.
var ErrMalformedUKI = errors.New("malformed UKI")

// UKI is a parsed unified kernel image: systemd-stub with the kernel, initrd, command line
// and os-release as PE sections.
type UKI struct {
	// Raw is the whole file: what the firmware loads and hashes.
	Raw []byte
	// Sections holds the data of each present StubSections entry, as systemd-stub sees it
	// in memory: VirtualSize bytes from the section's start.
	Sections map[string][]byte
}

// ParseUKI parses a UKI. It refuses what would make the prediction a guess:
//   - a file that is not an x86-64 PE32+ image;
//   - a section whose name systemd-stub would take for one of StubSections without being
//     it: the stub compares only the first strlen(name) bytes of the 8-byte section name, so
//     ".linuxAB" counts as .linux;
//   - a StubSections entry given twice (the stub silently uses the last);
//   - a section whose VirtualSize exceeds its raw data (the loader would zero-fill it, and
//     objcopy never writes one);
//   - a missing .linux, .cmdline or .initrd: a node image has all three, and without them
//     PCR 9 is not what a node boots with.
func ParseUKI(raw []byte) (*UKI, error) {
	f, err := pe.NewFile(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMalformedUKI, err)
	}
	defer f.Close()
	if f.Machine != pe.IMAGE_FILE_MACHINE_AMD64 {
		return nil, fmt.Errorf("%w: machine %#x is not x86-64", ErrMalformedUKI, f.Machine)
	}
	if _, ok := f.OptionalHeader.(*pe.OptionalHeader64); !ok {
		return nil, fmt.Errorf("%w: not a PE32+ image", ErrMalformedUKI)
	}
	u := &UKI{Raw: raw, Sections: map[string][]byte{}}
	for _, s := range f.Sections {
		name := stubSectionFor(s.Name)
		if name == "" {
			continue
		}
		if name != s.Name {
			return nil, fmt.Errorf("%w: section %q would be read by systemd-stub as %s (it compares name prefixes); rename it", ErrMalformedUKI, s.Name, name)
		}
		if _, dup := u.Sections[name]; dup {
			return nil, fmt.Errorf("%w: section %s given twice (systemd-stub would use the last)", ErrMalformedUKI, name)
		}
		if s.VirtualSize > s.Size {
			return nil, fmt.Errorf("%w: section %s has VirtualSize %d beyond its %d bytes of raw data", ErrMalformedUKI, name, s.VirtualSize, s.Size)
		}
		data, err := s.Data()
		if err != nil {
			return nil, fmt.Errorf("%w: section %s: %w", ErrMalformedUKI, name, err)
		}
		// systemd-stub measures and uses VirtualSize bytes; SizeOfRawData is rounded up to
		// the file alignment and its padding is not part of the section.
		u.Sections[name] = data[:s.VirtualSize]
	}
	for _, need := range []string{".linux", ".cmdline", ".initrd"} {
		if _, ok := u.Sections[need]; !ok {
			return nil, fmt.Errorf("%w: no %s section", ErrMalformedUKI, need)
		}
	}
	return u, nil
}

// stubSectionFor returns the StubSections entry systemd-stub would match a section named
// name to, or "". Names longer than 8 bytes live in the COFF string table and are "/N" in
// the section header the stub reads: they match nothing.
func stubSectionFor(name string) string {
	if len(name) > 8 {
		return ""
	}
	for _, s := range StubSections {
		if strings.HasPrefix(name, s) {
			return s
		}
	}
	return ""
}

// Cmdline returns the kernel command line systemd-stub 252 hands to the kernel from the
// .cmdline section: the section's bytes up to the first NUL (the stub converts it to UTF-16
// with a length-bounded copy that stops at NUL). The bytes must be printable ASCII: later
// systemd-stub versions rewrite control characters and strip trailing whitespace, so a
// command line with either would measure differently across stub versions; an image with
// one is refused rather than predicted by guess.
func (u *UKI) Cmdline() (string, error) {
	b := u.Sections[".cmdline"]
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	if len(b) == 0 {
		return "", fmt.Errorf("%w: empty .cmdline", ErrMalformedUKI)
	}
	for i, c := range b {
		if c < 0x20 || c > 0x7e {
			return "", fmt.Errorf("%w: .cmdline byte %d is %#x, not printable ASCII (write the command line without a trailing newline)", ErrMalformedUKI, i, c)
		}
	}
	if b[len(b)-1] == ' ' || b[0] == ' ' {
		return "", fmt.Errorf("%w: .cmdline starts or ends with a space", ErrMalformedUKI)
	}
	return string(b), nil
}
