package statedisk_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/statedisk"
)

// cryptsetupHeader formats a detached LUKS2 header with the real cryptsetup, with our
// cipher and KDF but without integrity: this kernel has no device-mapper, and cryptsetup
// needs dm-integrity to format an integrity-protected volume. Cached per test binary.
var cryptsetupHeader = sync.OnceValues(func() ([]byte, error) {
	dir, err := os.MkdirTemp("", "luks2-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	keyFile, disk, hdr := filepath.Join(dir, "key"), filepath.Join(dir, "disk.img"), filepath.Join(dir, "hdr.img")
	if err := os.WriteFile(keyFile, bytes.Repeat([]byte{7}, 32), 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(disk, make([]byte, 1<<20), 0o600); err != nil {
		return nil, err
	}
	out, err := exec.Command("cryptsetup", "luksFormat", "--type", "luks2", "--batch-mode",
		"--cipher", statedisk.LUKS2Cipher, "--key-size", "512", "--sector-size", "4096",
		"--pbkdf", "argon2id", "--pbkdf-memory", "32768", "--pbkdf-force-iterations", "4", "--pbkdf-parallel", "1",
		"--key-file", keyFile, "--header", hdr, disk).CombinedOutput()
	if err != nil {
		return nil, &exec.ExitError{Stderr: out}
	}
	data, err := os.ReadFile(hdr)
	if err != nil {
		return nil, err
	}
	return data, nil
})

// rewrite returns img with the JSON area of both header copies replaced by mutate's result
// and the checksums recomputed: a header as a writer who knows the format would make it.
func rewrite(t testing.TB, img []byte, mutate func(md map[string]any)) []byte {
	t.Helper()
	out := bytes.Clone(img)
	hdrSize := binary.BigEndian.Uint64(out[8:])
	area := out[4096:hdrSize]
	var md map[string]any
	require.NoError(t, json.Unmarshal(area[:bytes.IndexByte(area, 0)], &md))
	mutate(md)
	js, err := json.Marshal(md)
	require.NoError(t, err)
	for _, off := range []uint64{0, hdrSize} {
		copyArea := out[off+4096 : off+hdrSize]
		clear(copyArea)
		copy(copyArea, js)
		resum(out[off : off+hdrSize])
	}
	return out
}

func resum(copyBytes []byte) {
	clear(copyBytes[448 : 448+64])
	sum := sha256.Sum256(copyBytes)
	copy(copyBytes[448:], sum[:])
}

// wellFormed turns cryptsetup's detached header into the one Create makes on a device of a
// kernel with dm-integrity: a 96-byte volume key, HMAC-SHA256 integrity on the segment, the
// data after the header.
func wellFormed(md map[string]any) {
	obj(md, "keyslots", "0")["key_size"] = 96
	obj(md, "segments", "0")["offset"] = "16777216" // on the device, after cryptsetup's default 16 MiB of header and keyslots
	obj(md, "segments", "0")["integrity"] = map[string]any{"type": "hmac(sha256)", "journal_encryption": "none", "journal_integrity": "none"}
}

func obj(md map[string]any, path ...string) map[string]any {
	for _, p := range path {
		md = md[p].(map[string]any)
	}
	return md
}

func goodHeader(t testing.TB) []byte {
	img, err := cryptsetupHeader()
	require.NoError(t, err, "cryptsetup luksFormat")
	return rewrite(t, img, wellFormed)
}

func TestLUKS2HeaderAccepted(t *testing.T) {
	img := goodHeader(t)
	h, err := statedisk.ParseLUKS2Header(bytes.NewReader(img))
	require.NoError(t, err)
	assert.True(t, statedisk.ValidUUID(h.UUID), h.UUID)
	assert.Equal(t, 1, h.Keyslots)
	assert.False(t, h.Initialized)
	assert.Equal(t, uint64(16<<20), h.DataOffset)

	// cryptsetup reads the header we accept the way we do.
	path := filepath.Join(t.TempDir(), "hdr.img")
	require.NoError(t, os.WriteFile(path, img, 0o600))
	dump, err := exec.Command("cryptsetup", "luksDump", path).CombinedOutput()
	require.NoError(t, err, string(dump))
	assert.Contains(t, string(dump), "integrity: hmac(sha256)")
	assert.Contains(t, string(dump), "cipher: aes-xts-plain64")
	assert.Contains(t, string(dump), h.UUID)
	assert.Contains(t, string(dump), "offset: 16777216 [bytes]")

	t.Run("marker token", func(t *testing.T) {
		marked := rewrite(t, img, func(md map[string]any) {
			md["tokens"] = map[string]any{"0": map[string]any{"type": statedisk.MarkerTokenType, "keyslots": []any{}}}
		})
		h, err := statedisk.ParseLUKS2Header(bytes.NewReader(marked))
		require.NoError(t, err)
		assert.True(t, h.Initialized)
	})
}

// The header cryptsetup makes without integrity (what a host without dm-integrity, or an
// attacker, could put on the disk) is refused, naming both differences.
func TestLUKS2HeaderWithoutIntegrityRefused(t *testing.T) {
	img, err := cryptsetupHeader()
	require.NoError(t, err)
	_, err = statedisk.ParseLUKS2Header(bytes.NewReader(img))
	require.Error(t, err)
	assert.ErrorContains(t, err, "segment 0 has no integrity protection")
	assert.ErrorContains(t, err, "keyslot 0 key size 64 bytes, want 96")
}

func TestLUKS2HeaderRefused(t *testing.T) {
	good := goodHeader(t)
	hdrSize := binary.BigEndian.Uint64(good[8:])
	for name, tc := range map[string]struct {
		mutate func(md map[string]any) // JSON change, checksums fixed
		raw    func(img []byte) []byte // byte change, checksums as they fall
		want   string
	}{
		"null cipher": {
			mutate: func(md map[string]any) { obj(md, "segments", "0")["encryption"] = "cipher_null-ecb" },
			want:   `segment 0 cipher "cipher_null-ecb", want aes-xts-plain64`,
		},
		"null cipher in the keyslot area": {
			mutate: func(md map[string]any) { obj(md, "keyslots", "0", "area")["encryption"] = "cipher_null-ecb" },
			want:   "keyslot 0 area raw/cipher_null-ecb/64",
		},
		"wrong key size": {
			mutate: func(md map[string]any) { obj(md, "keyslots", "0")["key_size"] = 32 },
			want:   "keyslot 0 key size 32 bytes, want 96",
		},
		"unknown field in a segment": {
			mutate: func(md map[string]any) { obj(md, "segments", "0")["allow_plaintext"] = true },
			want:   `unknown field "allow_plaintext"`,
		},
		"unknown top-level field": {
			mutate: func(md map[string]any) { md["backdoor"] = map[string]any{} },
			want:   `unknown field "backdoor"`,
		},
		"data offset not a number": {
			mutate: func(md map[string]any) { obj(md, "segments", "0")["offset"] = "0x1000000" },
			want:   `segment 0 offset "0x1000000", want a multiple of 4096`,
		},
		"data offset inside a sector": {
			mutate: func(md map[string]any) { obj(md, "segments", "0")["offset"] = "16777217" },
			want:   `segment 0 offset "16777217", want a multiple of 4096`,
		},
		"other integrity": {
			mutate: func(md map[string]any) { obj(md, "segments", "0", "integrity")["type"] = "crc32c" },
			want:   `segment 0 integrity "crc32c", want hmac(sha256)`,
		},
		"weak KDF": {
			mutate: func(md map[string]any) { obj(md, "keyslots", "0", "kdf")["memory"] = 8 },
			want:   "keyslot 0 argon2id cost time=4 memory=8 KiB",
		},
		"foreign token": {
			mutate: func(md map[string]any) {
				md["tokens"] = map[string]any{"0": map[string]any{"type": "luks2-keyring", "keyslots": []any{"0"}}}
			},
			want: `token 0 of type "luks2-keyring": only an empty constellation-initialized token is allowed`,
		},
		"requirements": {
			mutate: func(md map[string]any) {
				obj(md, "config")["requirements"] = map[string]any{"mandatory": []any{"online-reencrypt"}}
			},
			want: "config requirements",
		},
		"second segment": {
			mutate: func(md map[string]any) { obj(md, "segments")["1"] = obj(md, "segments", "0") },
			want:   "2 segments, want exactly one",
		},
		"digest not covering the keyslot": {
			mutate: func(md map[string]any) { obj(md, "digests", "0")["keyslots"] = []any{"0", "0"} },
			want:   "digest 0 does not cover exactly every keyslot and segment",
		},
		"tampered JSON, checksum not fixed": {
			raw: func(img []byte) []byte {
				return bytes.Replace(img, []byte(`"aes-xts-plain64"`), []byte(`"cipher_null-ecb"`), 1)
			},
			want: "LUKS2 primary header: checksum mismatch",
		},
		"copies differ": {
			raw: func(img []byte) []byte {
				out := bytes.Clone(img)
				binary.BigEndian.PutUint64(out[hdrSize+16:], 99) // secondary seqid
				resum(out[hdrSize : 2*hdrSize])
				return out
			},
			want: "LUKS2 header copies differ",
		},
		"bad magic": {
			raw:  func(img []byte) []byte { out := bytes.Clone(img); out[0] = 'X'; return out },
			want: "bad magic",
		},
		"truncated": {
			raw:  func(img []byte) []byte { return img[:hdrSize+100] },
			want: "LUKS2 secondary header: reading binary header",
		},
	} {
		t.Run(name, func(t *testing.T) {
			img := good
			if tc.mutate != nil {
				img = rewrite(t, img, tc.mutate)
			}
			if tc.raw != nil {
				img = tc.raw(img)
			}
			h, err := statedisk.ParseLUKS2Header(bytes.NewReader(img))
			assert.Nil(t, h)
			assert.ErrorContains(t, err, tc.want)
		})
	}
}

// FuzzParseLUKS2Header fuzzes the JSON metadata (the part with structure) and the first 64
// bytes of the binary header (magic, version, sizes, sequence id) of a header whose
// checksums the harness keeps right, so the fuzzer gets past them. Inputs stay small: Go's
// fuzzer slows to a crawl on the 32 KiB of a whole header.
func FuzzParseLUKS2Header(f *testing.F) {
	good := goodHeader(f)
	hdrSize := binary.BigEndian.Uint64(good[8:])
	jsonOf := func(img []byte) []byte {
		area := img[4096:hdrSize]
		return bytes.Clone(area[:bytes.IndexByte(area, 0)])
	}
	f.Add(jsonOf(good), bytes.Clone(good[:64]))
	raw, err := cryptsetupHeader()
	require.NoError(f, err)
	f.Add(jsonOf(raw), bytes.Clone(raw[:64]))
	f.Fuzz(func(t *testing.T, js, prefix []byte) {
		if len(js) >= int(hdrSize)-4096 || len(prefix) > 64 {
			return
		}
		img := bytes.Clone(good[:2*hdrSize])
		for _, off := range []uint64{0, hdrSize} {
			c := img[off : off+hdrSize]
			copy(c[:len(prefix)], prefix)
			if off == hdrSize && len(prefix) >= 6 {
				copy(c[:6], "SKUL\xba\xbe")
			}
			clear(c[4096:])
			copy(c[4096:], js)
			resum(c)
		}
		h, err := statedisk.ParseLUKS2Header(bytes.NewReader(img))
		if err != nil {
			require.Nil(t, h)
			return
		}
		// Whatever passes meets the policy: it must be our configuration.
		require.True(t, bytes.Contains(js, []byte(`hmac(sha256)`)), "accepted without integrity")
		require.False(t, bytes.Contains(js, []byte("cipher_null")), "accepted a null cipher")
	})
}
