// Package vhd writes the footer that makes a raw disk image a fixed VHD: the format Azure's
// page blobs and managed disks take an uploaded disk in (Microsoft's "Virtual Hard Disk Image
// Format Specification", version 1.0: "Hard Disk Footer Format" and "CHS Calculation"). A
// fixed VHD is the raw disk, its size a multiple of 1 MiB (Azure refuses others), followed
// by this 512-byte footer.
package vhd

import (
	"encoding/binary"
	"fmt"
	"time"
)

// FooterSize is the size of the footer, and the VHD's sector size.
const FooterSize = 512

// Alignment is the size a disk must be a multiple of for Azure.
const Alignment = 1 << 20

// epoch is the VHD timestamp's zero: 2000-01-01 00:00:00 UTC.
var epoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// Fields of a fixed disk's footer.
const (
	cookie         = "conectix"
	features       = 0x00000002 // reserved bit, always set
	formatVersion  = 0x00010000
	fixedOffset    = 0xFFFFFFFFFFFFFFFF // a fixed disk has no dynamic header
	creatorApp     = "cnst"
	creatorVersion = 0x00010000
	creatorHostOS  = "Wi2k" // what Azure's own tools and qemu-img write
	diskTypeFixed  = 2
)

// AlignedSize is size rounded up to Alignment: the virtual size of the disk Azure gets (the
// raw image padded with zeros).
func AlignedSize(size int64) int64 {
	return (size + Alignment - 1) / Alignment * Alignment
}

// Footer returns the footer of a fixed disk of size bytes (a multiple of Alignment), made at
// now, with the disk's unique ID id.
func Footer(size int64, now time.Time, id [16]byte) ([FooterSize]byte, error) {
	var f [FooterSize]byte
	if size <= 0 || size%Alignment != 0 {
		return f, fmt.Errorf("a fixed VHD for Azure must be a positive multiple of %d bytes, got %d", Alignment, size)
	}
	be := binary.BigEndian
	copy(f[0:8], cookie)
	be.PutUint32(f[8:12], features)
	be.PutUint32(f[12:16], formatVersion)
	be.PutUint64(f[16:24], fixedOffset)
	be.PutUint32(f[24:28], uint32(now.UTC().Sub(epoch)/time.Second))
	copy(f[28:32], creatorApp)
	be.PutUint32(f[32:36], creatorVersion)
	copy(f[36:40], creatorHostOS)
	be.PutUint64(f[40:48], uint64(size))
	be.PutUint64(f[48:56], uint64(size))
	c, h, s := geometry(size)
	be.PutUint16(f[56:58], c)
	f[58], f[59] = h, s
	be.PutUint32(f[60:64], diskTypeFixed)
	copy(f[68:84], id[:])
	be.PutUint32(f[64:68], checksum(f))
	return f, nil
}

// checksum is the one's complement of the sum of the footer's bytes, its checksum field
// taken as zero.
func checksum(f [FooterSize]byte) uint32 {
	var sum uint32
	for i, b := range f {
		if i >= 64 && i < 68 {
			continue
		}
		sum += uint32(b)
	}
	return ^sum
}

// geometry is the disk's cylinders, heads and sectors per track: the largest geometry, as
// qemu-img writes it for a disk whose size is kept exactly (force_size), the way VHDs were
// made for Azure by the project this one succeeds. A reader then takes the current size, not
// the geometry; the specification's CHS calculation would round the size down.
func geometry(int64) (cylinders uint16, heads, sectorsPerTrack uint8) {
	return 65535, 16, 255
}
