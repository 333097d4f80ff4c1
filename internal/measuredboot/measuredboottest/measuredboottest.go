// Package measuredboottest builds the inputs of measured-boot predictions for tests: a
// minimal PE image (a UKI of given sections, as objcopy makes of a stub) and a GPT disk.
package measuredboottest

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
)

// Section is a section of a synthetic PE image.
type Section struct {
	Name string
	Data []byte
	// VirtualSize overrides len(Data) when non-zero.
	VirtualSize uint32
}

// PE writes a minimal x86-64 PE32+ image with the given sections (file alignment
// 0x200, sections one after another) and, when cert is not nil, a certificate table at
// the end. It is what objcopy makes of a stub plus sections, small enough for -short tests
// and fuzz seeds.
func PE(sections []Section, cert []byte) []byte {
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
		rawOff += align(uint32(len(s.Data)))
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
		copy(name[:], s.Name)
		b.Write(name[:])
		vs := s.VirtualSize
		if vs == 0 {
			vs = uint32(len(s.Data))
		}
		le(vs)
		le(va)
		le(align(uint32(len(s.Data))))
		le(off)
		b.Write(make([]byte, 12))
		le(uint32(0x40000040)) // initialized data, readable
		off += align(uint32(len(s.Data)))
		va += (vs + 0xfff) &^ 0xfff
	}
	b.Write(make([]byte, int(sizeOfHeaders)-b.Len()))
	for _, s := range sections {
		b.Write(s.Data)
		b.Write(make([]byte, int(align(uint32(len(s.Data))))-len(s.Data)))
	}
	b.Write(cert)
	return b.Bytes()
}

// GPT builds a 512-byte-sector disk with a protective MBR slot, a primary header at
// LBA 1 and 128 entries of 128 bytes at LBA 2; used[i] fills entry i with a type GUID.
func GPT(used ...int) []byte {
	disk := make([]byte, 34*512)
	entries := disk[2*512 : 34*512]
	for _, i := range used {
		e := entries[i*128 : (i+1)*128]
		copy(e, bytes.Repeat([]byte{byte(i + 1)}, 16)) // type GUID
		copy(e[16:], bytes.Repeat([]byte{0xee}, 16))   // partition GUID
		binary.LittleEndian.PutUint64(e[32:], uint64(2048*(i+1)))
	}
	h := disk[512:1024]
	copy(h, "EFI PART")
	binary.LittleEndian.PutUint32(h[8:], 0x00010000)
	binary.LittleEndian.PutUint32(h[12:], 92)
	binary.LittleEndian.PutUint64(h[24:], 1)
	binary.LittleEndian.PutUint64(h[72:], 2)
	binary.LittleEndian.PutUint32(h[80:], 128)
	binary.LittleEndian.PutUint32(h[84:], 128)
	FixCRCs(disk)
	return disk
}

// FixCRCs recomputes the primary header's CRCs of a disk GPT built.
func FixCRCs(disk []byte) {
	h := disk[512:1024]
	binary.LittleEndian.PutUint32(h[88:], crc32.ChecksumIEEE(disk[2*512:34*512]))
	binary.LittleEndian.PutUint32(h[16:], 0)
	binary.LittleEndian.PutUint32(h[16:], crc32.ChecksumIEEE(h[:binary.LittleEndian.Uint32(h[12:])]))
}

// UKI is a UKI of the stub and the given sections.
func UKI(osrel, cmdline, kernel, initrd []byte) []byte {
	stubText := bytes.Repeat([]byte{0xcc}, 700)
	return PE([]Section{
		{Name: ".text", Data: stubText},
		{Name: ".osrel", Data: osrel},
		{Name: ".cmdline", Data: cmdline},
		{Name: ".linux", Data: kernel},
		{Name: ".initrd", Data: initrd},
	}, nil)
}
