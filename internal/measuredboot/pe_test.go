package measuredboot

import (
	"bytes"
	"encoding/binary"
)

// testSection is a section of a synthetic PE image.
type testSection struct {
	name string
	data []byte
	// virtualSize overrides len(data) when non-zero.
	virtualSize uint32
}

// buildTestPE writes a minimal x86-64 PE32+ image with the given sections (file alignment
// 0x200, sections one after another) and, when cert is not nil, a certificate table at
// the end. It is what objcopy makes of a stub plus sections, small enough for -short tests
// and fuzz seeds.
func buildTestPE(sections []testSection, cert []byte) []byte {
	const (
		peOff     = 0x40
		optSize   = 240
		fileAlign = 0x200
	)
	align := func(n uint32) uint32 { return (n + fileAlign - 1) &^ (fileAlign - 1) }
	headerEnd := uint32(peOff + 4 + 20 + optSize + 40*len(sections))
	sizeOfHeaders := align(headerEnd)

	var b bytes.Buffer
	le := func(v any) { _ = binary.Write(&b, binary.LittleEndian, v) }
	dos := make([]byte, peOff)
	copy(dos, "MZ")
	binary.LittleEndian.PutUint32(dos[0x3c:], peOff)
	b.Write(dos)
	b.WriteString("PE\x00\x00")
	// COFF header.
	le(uint16(0x8664))
	le(uint16(len(sections)))
	le(uint32(0)) // timestamp
	le(uint32(0)) // symbol table
	le(uint32(0)) // symbols
	le(uint16(optSize))
	le(uint16(0x2022)) // executable, large address aware, DLL
	// Optional header, PE32+.
	opt := make([]byte, optSize)
	binary.LittleEndian.PutUint16(opt[0:], 0x20b)
	binary.LittleEndian.PutUint32(opt[32:], 0x1000)    // SectionAlignment
	binary.LittleEndian.PutUint32(opt[36:], fileAlign) // FileAlignment
	binary.LittleEndian.PutUint32(opt[60:], sizeOfHeaders)
	binary.LittleEndian.PutUint32(opt[64:], 0xdeadbeef) // CheckSum: excluded from the digest
	binary.LittleEndian.PutUint16(opt[68:], 10)         // subsystem: EFI application
	binary.LittleEndian.PutUint32(opt[108:], 16)        // NumberOfRvaAndSizes
	rawOff := sizeOfHeaders
	for _, s := range sections {
		rawOff += align(uint32(len(s.data)))
	}
	if cert != nil {
		binary.LittleEndian.PutUint32(opt[112+4*8:], rawOff)
		binary.LittleEndian.PutUint32(opt[112+4*8+4:], uint32(len(cert)))
	}
	b.Write(opt)
	// Section headers.
	off, va := sizeOfHeaders, uint32(0x1000)
	for _, s := range sections {
		var name [8]byte
		copy(name[:], s.name)
		b.Write(name[:])
		vs := s.virtualSize
		if vs == 0 {
			vs = uint32(len(s.data))
		}
		le(vs)
		le(va)
		le(align(uint32(len(s.data))))
		le(off)
		b.Write(make([]byte, 12))
		le(uint32(0x40000040)) // initialized data, readable
		off += align(uint32(len(s.data)))
		va += (vs + 0xfff) &^ 0xfff
	}
	b.Write(make([]byte, int(sizeOfHeaders)-b.Len()))
	for _, s := range sections {
		b.Write(s.data)
		b.Write(make([]byte, int(align(uint32(len(s.data))))-len(s.data)))
	}
	b.Write(cert)
	return b.Bytes()
}
