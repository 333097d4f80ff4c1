package eventlog

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"

	"github.com/google/go-eventlog/tcg"
)

// Builder writes a crypto-agile TCG event log with SHA-256 digests only: the format firmware
// writes and the kernel exposes as binary_bios_measurements. A platform that measures into
// PCRs (the local provider playing firmware) records each extension with Add, so verifiers can
// replay what it measured.
type Builder struct {
	buf bytes.Buffer
}

// tpmAlgSHA256 is TPM_ALG_SHA256.
const tpmAlgSHA256 = 0x000B

// NewBuilder starts a log with its Spec ID event (TCG PC Client PFP, TCG_EfiSpecIDEvent):
// version 2.0, one algorithm, SHA-256.
func NewBuilder() *Builder {
	var spec bytes.Buffer
	spec.WriteString("Spec ID Event03\x00")
	le(&spec, uint32(0)) // platform class: client
	spec.Write([]byte{0, 2, 0, 2})
	le(&spec, uint32(1))
	le(&spec, uint16(tpmAlgSHA256))
	le(&spec, uint16(sha256.Size))
	spec.WriteByte(0) // vendor info size

	b := &Builder{}
	// The Spec ID event is in the SHA-1 (TCG_PCR_EVENT) format, PCR 0, EV_NO_ACTION, zero digest.
	le(&b.buf, uint32(0))
	le(&b.buf, uint32(tcg.NoAction))
	b.buf.Write(make([]byte, 20))
	le(&b.buf, uint32(spec.Len()))
	b.buf.Write(spec.Bytes())
	return b
}

// Add records an event whose digest is SHA-256(data) and returns that digest: what the caller
// extends into pcr.
func (b *Builder) Add(pcr uint32, typ tcg.EventType, data []byte) [32]byte {
	d := sha256.Sum256(data)
	b.AddDigest(pcr, typ, d, data)
	return d
}

// AddDigest records an event with a digest that is not the hash of its data (an image
// measured by its content, described by name).
func (b *Builder) AddDigest(pcr uint32, typ tcg.EventType, digest [32]byte, data []byte) {
	le(&b.buf, pcr)
	le(&b.buf, uint32(typ))
	le(&b.buf, uint32(1))
	le(&b.buf, uint16(tpmAlgSHA256))
	b.buf.Write(digest[:])
	le(&b.buf, uint32(len(data)))
	b.buf.Write(data)
}

// Bytes returns the log written so far.
func (b *Builder) Bytes() []byte { return bytes.Clone(b.buf.Bytes()) }

func le(buf *bytes.Buffer, v any) { _ = binary.Write(buf, binary.LittleEndian, v) }
