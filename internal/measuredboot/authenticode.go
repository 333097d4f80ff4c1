package measuredboot

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

// Offsets in a PE/COFF image (Microsoft PE/COFF specification, "Optional Header").
const (
	dosLfanewOffset   = 0x3c // e_lfanew: file offset of the PE signature
	coffHeaderSize    = 20
	sectionHeaderSize = 40
	optMagicPE32      = 0x10b
	optMagicPE32Plus  = 0x20b
	optChecksumOffset = 64 // CheckSum, in both PE32 and PE32+
	optDataDirPE32    = 96
	optDataDirPE32Pl  = 112
	dataDirSecurity   = 4 // IMAGE_DIRECTORY_ENTRY_SECURITY: the certificate table
)

// ErrMalformedPE is wrapped by every error about an image that is not a PE/COFF file the
// firmware would measure.
var ErrMalformedPE = errors.New("malformed PE image")

// AuthenticodeSHA256 returns the SHA-256 Authenticode digest of a PE/COFF image: the digest
// UEFI firmware extends into PCR 4 when it loads the image (EV_EFI_BOOT_SERVICES_APPLICATION).
//
// It follows EDK2's measurement (SecurityPkg Tcg2Dxe, MeasurePeImageAndExtend), which is
// what OVMF runs, step by step, rather than hashing the file minus three ranges (as some
// libraries do): the two agree on well-formed images, and where they differ (a gap between
// the headers and the first section) the firmware's result is the one a quote shows.
//
//  1. the headers up to SizeOfHeaders, without the CheckSum field and without the security
//     (certificate table) entry of the data directory;
//  2. each section with raw data, in ascending PointerToRawData order, SizeOfRawData bytes;
//  3. the bytes after what 1 and 2 counted, up to the file size minus the certificate table.
//
// The header fields are read from the bytes directly: every offset is checked against the
// image, so a malformed image is an error, never a panic.
func AuthenticodeSHA256(img []byte) ([sha256.Size]byte, error) {
	var zero [sha256.Size]byte
	h, err := parsePEHeaders(img)
	if err != nil {
		return zero, err
	}
	d := sha256.New()
	// 1. Headers, minus CheckSum and the security directory entry.
	d.Write(img[:h.checksumOff])
	if h.numDataDirs <= dataDirSecurity {
		d.Write(img[h.checksumOff+4 : h.sizeOfHeaders])
	} else {
		d.Write(img[h.checksumOff+4 : h.securityDirOff])
		d.Write(img[h.securityDirOff+8 : h.sizeOfHeaders])
	}
	hashed := uint64(h.sizeOfHeaders)
	// 2. Sections by file offset. EDK2 sorts with an insertion sort: stable, as SortStableFunc.
	sections := slices.Clone(h.sections)
	slices.SortStableFunc(sections, func(a, b rawSection) int { return int(int64(a.pointerToRawData) - int64(b.pointerToRawData)) })
	for _, s := range sections {
		if s.sizeOfRawData == 0 {
			continue
		}
		end := uint64(s.pointerToRawData) + uint64(s.sizeOfRawData)
		if end > uint64(len(img)) {
			return zero, fmt.Errorf("%w: section %q raw data [%#x, %#x) lies beyond the image's %d bytes", ErrMalformedPE, s.name, s.pointerToRawData, end, len(img))
		}
		d.Write(img[s.pointerToRawData:end])
		hashed += uint64(s.sizeOfRawData)
	}
	// 3. Trailing data, minus the certificate table, which must be the end of the file.
	size := uint64(len(img))
	if size > hashed {
		certSize := uint64(0)
		if h.numDataDirs > dataDirSecurity {
			certSize = uint64(h.securitySize)
		}
		switch {
		case size > hashed+certSize:
			d.Write(img[hashed : size-certSize])
		case size < hashed+certSize:
			return zero, fmt.Errorf("%w: certificate table of %d bytes does not fit after the %d bytes of headers and sections (image has %d)", ErrMalformedPE, certSize, hashed, size)
		}
	}
	var out [sha256.Size]byte
	d.Sum(out[:0])
	return out, nil
}

// peHeaders are the fields of a PE image's headers the Authenticode digest needs.
type peHeaders struct {
	checksumOff    uint64
	securityDirOff uint64 // offset of the security entry of the data directory
	securitySize   uint32
	numDataDirs    uint32
	sizeOfHeaders  uint64
	sections       []rawSection
}

type rawSection struct {
	name             string
	pointerToRawData uint32
	sizeOfRawData    uint32
}

func parsePEHeaders(img []byte) (peHeaders, error) {
	var h peHeaders
	le := binary.LittleEndian
	if len(img) < dosLfanewOffset+4 || img[0] != 'M' || img[1] != 'Z' {
		return h, fmt.Errorf("%w: no MZ (DOS) header", ErrMalformedPE)
	}
	peOff := uint64(le.Uint32(img[dosLfanewOffset:]))
	coff := peOff + 4
	opt := coff + coffHeaderSize
	if opt > uint64(len(img)) || string(img[peOff:peOff+4]) != "PE\x00\x00" {
		return h, fmt.Errorf("%w: no PE signature at offset %#x", ErrMalformedPE, peOff)
	}
	numSections := uint64(le.Uint16(img[coff+2:]))
	optSize := uint64(le.Uint16(img[coff+16:]))
	if opt+optSize > uint64(len(img)) || optSize < 2 {
		return h, fmt.Errorf("%w: optional header of %d bytes at %#x lies beyond the image", ErrMalformedPE, optSize, opt)
	}
	var dataDir, numDirsOff uint64
	switch magic := le.Uint16(img[opt:]); magic {
	case optMagicPE32:
		dataDir, numDirsOff = opt+optDataDirPE32, opt+optDataDirPE32-4
	case optMagicPE32Plus:
		dataDir, numDirsOff = opt+optDataDirPE32Pl, opt+optDataDirPE32Pl-4
	default:
		return h, fmt.Errorf("%w: optional header magic %#x is neither PE32 nor PE32+", ErrMalformedPE, magic)
	}
	if dataDir > opt+optSize {
		return h, fmt.Errorf("%w: optional header of %d bytes is too short", ErrMalformedPE, optSize)
	}
	h.checksumOff = opt + optChecksumOffset
	h.sizeOfHeaders = uint64(le.Uint32(img[opt+60:]))
	h.numDataDirs = le.Uint32(img[numDirsOff:])
	if uint64(h.numDataDirs)*8 > opt+optSize-dataDir {
		return h, fmt.Errorf("%w: %d data directory entries do not fit the optional header", ErrMalformedPE, h.numDataDirs)
	}
	if h.numDataDirs > dataDirSecurity {
		h.securityDirOff = dataDir + dataDirSecurity*8
		h.securitySize = le.Uint32(img[h.securityDirOff+4:])
	}
	sectionTable := opt + optSize
	if sectionTable+numSections*sectionHeaderSize > uint64(len(img)) {
		return h, fmt.Errorf("%w: section table of %d entries lies beyond the image", ErrMalformedPE, numSections)
	}
	// The headers hashed must cover the fields skipped and stay inside the image.
	if h.sizeOfHeaders > uint64(len(img)) || h.sizeOfHeaders < sectionTable || (h.securityDirOff != 0 && h.sizeOfHeaders < h.securityDirOff+8) {
		return h, fmt.Errorf("%w: SizeOfHeaders %#x does not cover the headers or exceeds the image's %d bytes", ErrMalformedPE, h.sizeOfHeaders, len(img))
	}
	for i := range numSections {
		s := img[sectionTable+i*sectionHeaderSize:]
		h.sections = append(h.sections, rawSection{
			name:             string(trimNUL(s[:8])),
			sizeOfRawData:    le.Uint32(s[16:]),
			pointerToRawData: le.Uint32(s[20:]),
		})
	}
	return h, nil
}

func trimNUL(b []byte) []byte {
	for i, c := range b {
		if c == 0 {
			return b[:i]
		}
	}
	return b
}
