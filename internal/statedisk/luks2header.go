package statedisk

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/openconstellation/constellation/pkg/strictjson"
)

// LUKS2 on-disk format (cryptsetup's LUKS2 specification, docs/on-disk-format-luks2.pdf):
// two copies of a 4096-byte binary header, each followed by a JSON area of hdr_size-4096
// bytes, the second copy at offset hdr_size.
const (
	luks2BinaryHeaderSize = 4096
	luks2MaxHeaderSize    = 4 << 20
	luks2MinHeaderSize    = 16 << 10
)

var (
	luks2Magic1 = []byte("LUKS\xba\xbe")
	luks2Magic2 = []byte("SKUL\xba\xbe")
)

// binary header field offsets.
const (
	offMagic     = 0
	offVersion   = 6
	offHdrSize   = 8
	offSeqID     = 16
	offCsumAlg   = 72
	offUUID      = 168
	offHdrOffset = 256
	offCsum      = 448
	csumSize     = 64
)

// The policy every state disk's header must meet. A header is untrusted input: whoever
// controls the disk controls it, and cryptsetup honours what it says (a "cipher_null"
// segment opens with any key and stores plaintext). So the header is checked against the
// exact configuration Create makes before any key touches it.
const (
	// LUKS2Cipher is the data cipher: AES-256 in XTS mode (512-bit key).
	LUKS2Cipher = "aes-xts-plain64"
	// LUKS2Integrity is the dm-integrity tag: HMAC-SHA256, keyed from the volume key.
	LUKS2Integrity = "hmac(sha256)"
	// LUKS2VolumeKeySize is the volume key: 64 bytes for XTS plus 32 for the HMAC.
	LUKS2VolumeKeySize = 96
	luks2SectorSize    = 4096
	luks2AreaKeySize   = 64
	// Minimum argon2id cost a keyslot may declare: a cheaper KDF would not slow down a
	// guess of a weak key (ours are random, but the header is not ours to trust).
	luks2MinArgonTime   = 4
	luks2MinArgonMemory = 32 << 10 // KiB
	// MarkerTokenType is the LUKS2 token that records that a disk is initialized.
	MarkerTokenType = "constellation-initialized"
)

// LUKS2Header is a parsed, verified and policy-checked LUKS2 header.
type LUKS2Header struct {
	UUID string
	// SeqID is the header's update counter.
	SeqID uint64
	// Initialized reports whether the marker token is present.
	Initialized bool
	// Keyslots is the number of keyslots in use.
	Keyslots int
	// DataOffset is where the encrypted data segment starts on the device, in bytes (for
	// this header's integrity layout: the dm-integrity superblock, its journal, then tags
	// and data).
	DataOffset uint64
}

// luks2Metadata is the JSON area. Decoding is strict (unknown fields are refused): a field
// this code does not know is a field whose effect on cryptsetup it cannot vouch for.
type luks2Metadata struct {
	Keyslots map[string]luks2Keyslot `json:"keyslots"`
	Tokens   map[string]luks2Token   `json:"tokens"`
	Segments map[string]luks2Segment `json:"segments"`
	Digests  map[string]luks2Digest  `json:"digests"`
	Config   luks2Config             `json:"config"`
}

type luks2Keyslot struct {
	Type     string    `json:"type"`
	KeySize  int       `json:"key_size"`
	AF       luks2AF   `json:"af"`
	Area     luks2Area `json:"area"`
	KDF      luks2KDF  `json:"kdf"`
	Priority *int      `json:"priority,omitempty"`
}

type luks2AF struct {
	Type    string `json:"type"`
	Stripes int    `json:"stripes"`
	Hash    string `json:"hash"`
}

type luks2Area struct {
	Type       string `json:"type"`
	Offset     string `json:"offset"`
	Size       string `json:"size"`
	Encryption string `json:"encryption"`
	KeySize    int    `json:"key_size"`
}

type luks2KDF struct {
	Type   string `json:"type"`
	Time   int    `json:"time"`
	Memory int    `json:"memory"`
	CPUs   int    `json:"cpus"`
	Salt   []byte `json:"salt"`
}

type luks2Token struct {
	Type     string   `json:"type"`
	Keyslots []string `json:"keyslots"`
}

type luks2Segment struct {
	Type       string          `json:"type"`
	Offset     string          `json:"offset"`
	Size       string          `json:"size"`
	IVTweak    string          `json:"iv_tweak"`
	Encryption string          `json:"encryption"`
	SectorSize int             `json:"sector_size"`
	Integrity  *luks2Integrity `json:"integrity,omitempty"`
	Flags      []string        `json:"flags,omitempty"`
}

type luks2Integrity struct {
	Type              string `json:"type"`
	JournalEncryption string `json:"journal_encryption"`
	JournalIntegrity  string `json:"journal_integrity"`
}

type luks2Digest struct {
	Type       string   `json:"type"`
	Keyslots   []string `json:"keyslots"`
	Segments   []string `json:"segments"`
	Hash       string   `json:"hash"`
	Iterations int      `json:"iterations"`
	Salt       []byte   `json:"salt"`
	Digest     []byte   `json:"digest"`
}

type luks2Config struct {
	JSONSize     string   `json:"json_size"`
	KeyslotsSize string   `json:"keyslots_size"`
	Flags        []string `json:"flags,omitempty"`
	Requirements *struct {
		Mandatory []string `json:"mandatory"`
	} `json:"requirements,omitempty"`
}

// ParseLUKS2Header parses, verifies and checks the header at the start of r (a detached
// header file or the start of a device). Parse: both binary headers and JSON areas, strict
// JSON. Verify: magic, version, sizes, checksums, both copies agree. Policy: the
// configuration of LUKS2Cipher, LUKS2Integrity, argon2id. It returns the header only if
// every check passes; the error names every policy violation.
func ParseLUKS2Header(r io.ReaderAt) (*LUKS2Header, error) {
	primary, err := readLUKS2Copy(r, 0, nil)
	if err != nil {
		return nil, fmt.Errorf("LUKS2 primary header: %w", err)
	}
	secondary, err := readLUKS2Copy(r, primary.hdrSize, primary)
	if err != nil {
		return nil, fmt.Errorf("LUKS2 secondary header: %w", err)
	}
	// cryptsetup repairs a divergent copy from the other one; an attacker who controls
	// the disk could make each copy look fine to a different reader. Both must agree.
	if primary.seqID != secondary.seqID || primary.uuid != secondary.uuid || !bytes.Equal(primary.json, secondary.json) {
		return nil, errors.New("LUKS2 header copies differ")
	}

	// Whoever controls the disk writes this JSON: a key twice or in other letter case would
	// read one way here and another way in cryptsetup (json-c, case-sensitive).
	var md luks2Metadata
	if err := strictjson.Unmarshal(primary.json, &md); err != nil {
		return nil, fmt.Errorf("LUKS2 metadata: %w", err)
	}
	if err := md.check(primary.hdrSize); err != nil {
		return nil, err
	}
	h := &LUKS2Header{UUID: primary.uuid, SeqID: primary.seqID, Keyslots: len(md.Keyslots)}
	for _, s := range md.Segments { // exactly one, and its offset a number (check)
		h.DataOffset, _ = strconv.ParseUint(s.Offset, 10, 64)
	}
	for _, t := range md.Tokens {
		if t.Type == MarkerTokenType {
			h.Initialized = true
		}
	}
	return h, nil
}

type luks2Copy struct {
	hdrSize uint64
	seqID   uint64
	uuid    string
	json    []byte
}

func readLUKS2Copy(r io.ReaderAt, offset uint64, primary *luks2Copy) (*luks2Copy, error) {
	bin := make([]byte, luks2BinaryHeaderSize)
	if _, err := r.ReadAt(bin, int64(offset)); err != nil {
		return nil, fmt.Errorf("reading binary header at %d: %w", offset, err)
	}
	magic := luks2Magic1
	if primary != nil {
		magic = luks2Magic2
	}
	if !bytes.Equal(bin[offMagic:offMagic+6], magic) {
		return nil, errors.New("not a LUKS header (bad magic)")
	}
	if v := binary.BigEndian.Uint16(bin[offVersion:]); v != 2 {
		return nil, fmt.Errorf("LUKS version %d, want 2", v)
	}
	c := &luks2Copy{
		hdrSize: binary.BigEndian.Uint64(bin[offHdrSize:]),
		seqID:   binary.BigEndian.Uint64(bin[offSeqID:]),
		uuid:    cString(bin[offUUID : offUUID+40]),
	}
	if c.hdrSize < luks2MinHeaderSize || c.hdrSize > luks2MaxHeaderSize || c.hdrSize&(c.hdrSize-1) != 0 {
		return nil, fmt.Errorf("header size %d is not a power of two in %d..%d", c.hdrSize, luks2MinHeaderSize, luks2MaxHeaderSize)
	}
	if primary != nil && c.hdrSize != primary.hdrSize {
		return nil, fmt.Errorf("header size %d, primary says %d", c.hdrSize, primary.hdrSize)
	}
	if got := binary.BigEndian.Uint64(bin[offHdrOffset:]); got != offset {
		return nil, fmt.Errorf("header says it is at offset %d, found at %d", got, offset)
	}
	if alg := cString(bin[offCsumAlg : offCsumAlg+32]); alg != "sha256" {
		return nil, fmt.Errorf("checksum algorithm %q, want sha256", alg)
	}
	area := make([]byte, c.hdrSize-luks2BinaryHeaderSize)
	if _, err := r.ReadAt(area, int64(offset+luks2BinaryHeaderSize)); err != nil {
		return nil, fmt.Errorf("reading JSON area: %w", err)
	}
	want := append([]byte(nil), bin[offCsum:offCsum+sha256.Size]...)
	if !isZero(bin[offCsum+sha256.Size : offCsum+csumSize]) {
		return nil, errors.New("checksum field has data after the SHA-256 digest")
	}
	clear(bin[offCsum : offCsum+csumSize])
	h := sha256.New()
	h.Write(bin)
	h.Write(area)
	if !bytes.Equal(h.Sum(nil), want) {
		return nil, errors.New("checksum mismatch")
	}
	end := bytes.IndexByte(area, 0)
	if end < 0 {
		return nil, errors.New("JSON area is not NUL-terminated")
	}
	if !isZero(area[end:]) {
		return nil, errors.New("JSON area has data after its terminator")
	}
	c.json = area[:end]
	return c, nil
}

// check refuses a header that is not exactly what this package creates, naming every
// problem: its config, its one segment, its keyslots, its one digest, its tokens.
func (md *luks2Metadata) check(hdrSize uint64) error {
	var problems []error
	fail := func(format string, args ...any) { problems = append(problems, fmt.Errorf(format, args...)) }
	md.checkConfig(hdrSize, fail)
	md.checkSegments(fail)
	md.checkKeyslots(fail)
	md.checkDigests(fail)
	for id, t := range md.Tokens {
		if t.Type != MarkerTokenType || len(t.Keyslots) != 0 {
			fail("token %s of type %q: only an empty %s token is allowed", id, t.Type, MarkerTokenType)
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("LUKS2 header refused: %w", errors.Join(problems...))
	}
	return nil
}

// checkConfig: the JSON area fills the header, no flags, no requirements.
func (md *luks2Metadata) checkConfig(hdrSize uint64, fail func(string, ...any)) {
	if want := strconv.FormatUint(hdrSize-luks2BinaryHeaderSize, 10); md.Config.JSONSize != want {
		fail("config json_size %q, want %s", md.Config.JSONSize, want)
	}
	if len(md.Config.Flags) > 0 {
		fail("config flags %q: none allowed", md.Config.Flags)
	}
	if md.Config.Requirements != nil {
		fail("config requirements %q: none allowed", md.Config.Requirements.Mandatory)
	}
}

// checkSegments: exactly one segment, encrypted with integrity protection, no flags.
func (md *luks2Metadata) checkSegments(fail func(string, ...any)) {
	if len(md.Segments) != 1 {
		fail("%d segments, want exactly one", len(md.Segments))
	}
	for id, s := range md.Segments {
		if s.Type != "crypt" {
			fail("segment %s of type %q, want crypt", id, s.Type)
		}
		if s.Encryption != LUKS2Cipher {
			fail("segment %s cipher %q, want %s", id, s.Encryption, LUKS2Cipher)
		}
		if s.SectorSize != luks2SectorSize {
			fail("segment %s sector size %d, want %d", id, s.SectorSize, luks2SectorSize)
		}
		switch {
		case s.Integrity == nil:
			fail("segment %s has no integrity protection, want %s", id, LUKS2Integrity)
		case s.Integrity.Type != LUKS2Integrity:
			fail("segment %s integrity %q, want %s", id, s.Integrity.Type, LUKS2Integrity)
		}
		if len(s.Flags) > 0 {
			fail("segment %s flags %q: none allowed", id, s.Flags)
		}
		if off, err := strconv.ParseUint(s.Offset, 10, 64); err != nil || off%luks2SectorSize != 0 {
			fail("segment %s offset %q, want a multiple of %d", id, s.Offset, luks2SectorSize)
		}
	}
}

// checkKeyslots: at least one keyslot, each of our key size, splitter, area and argon2id
// cost.
func (md *luks2Metadata) checkKeyslots(fail func(string, ...any)) {
	if len(md.Keyslots) == 0 {
		fail("no keyslots")
	}
	for id, k := range md.Keyslots {
		if k.Type != "luks2" {
			fail("keyslot %s of type %q, want luks2", id, k.Type)
		}
		if k.KeySize != LUKS2VolumeKeySize {
			fail("keyslot %s key size %d bytes, want %d (XTS-512 + HMAC-SHA256)", id, k.KeySize, LUKS2VolumeKeySize)
		}
		if k.AF.Type != "luks1" || k.AF.Hash != "sha256" || k.AF.Stripes != 4000 {
			fail("keyslot %s anti-forensic splitter %s/%s/%d, want luks1/sha256/4000", id, k.AF.Type, k.AF.Hash, k.AF.Stripes)
		}
		if k.Area.Type != "raw" || k.Area.Encryption != LUKS2Cipher || k.Area.KeySize != luks2AreaKeySize {
			fail("keyslot %s area %s/%s/%d, want raw/%s/%d", id, k.Area.Type, k.Area.Encryption, k.Area.KeySize, LUKS2Cipher, luks2AreaKeySize)
		}
		if k.KDF.Type != "argon2id" {
			fail("keyslot %s KDF %q, want argon2id", id, k.KDF.Type)
		} else if k.KDF.Time < luks2MinArgonTime || k.KDF.Memory < luks2MinArgonMemory || k.KDF.CPUs < 1 || len(k.KDF.Salt) < 16 {
			fail("keyslot %s argon2id cost time=%d memory=%d KiB cpus=%d salt=%d bytes below time=%d memory=%d KiB cpus=1 salt=16",
				id, k.KDF.Time, k.KDF.Memory, k.KDF.CPUs, len(k.KDF.Salt), luks2MinArgonTime, luks2MinArgonMemory)
		}
	}
}

// checkDigests: exactly one PBKDF2-SHA256 digest, covering every keyslot and segment.
func (md *luks2Metadata) checkDigests(fail func(string, ...any)) {
	if len(md.Digests) != 1 {
		fail("%d digests, want exactly one", len(md.Digests))
	}
	for id, d := range md.Digests {
		if d.Type != "pbkdf2" || d.Hash != "sha256" {
			fail("digest %s %s/%s, want pbkdf2/sha256", id, d.Type, d.Hash)
		}
		if !sameSet(d.Keyslots, md.Keyslots) || !sameSet(d.Segments, md.Segments) {
			fail("digest %s does not cover exactly every keyslot and segment", id)
		}
	}
}

// sameSet reports whether ids names every key of m exactly once and nothing else.
func sameSet[V any](ids []string, m map[string]V) bool {
	seen := map[string]bool{}
	for _, id := range ids {
		if _, ok := m[id]; !ok || seen[id] {
			return false
		}
		seen[id] = true
	}
	return len(seen) == len(m)
}

func cString(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

func isZero(b []byte) bool {
	return len(bytes.TrimLeft(b, "\x00")) == 0
}
