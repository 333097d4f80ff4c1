package kms

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/pkg/attestation/vtpm/vtpmtest"
)

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	require.NoError(t, err)
	return b
}

func seq(from, to byte) []byte {
	var out []byte
	for b := int(from); b <= int(to); b++ {
		out = append(out, byte(b))
	}
	return out
}

// TestHKDFVectors checks the derivation against RFC 5869 appendix A, test cases 1-3 (SHA-256).
func TestHKDFVectors(t *testing.T) {
	testCases := map[string]struct {
		ikm, salt, info []byte
		length          int
		okm             string
	}{
		"A.1 basic": {
			ikm: bytes.Repeat([]byte{0x0b}, 22), salt: seq(0x00, 0x0c), info: seq(0xf0, 0xf9), length: 42,
			okm: "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865",
		},
		"A.2 long inputs": {
			ikm: seq(0x00, 0x4f), salt: seq(0x60, 0xaf), info: seq(0xb0, 0xff), length: 82,
			okm: "b11e398dc80327a1c8e7f78c596a49344f012eda2d4efad8a050cc4c19afa97c59045a99cac7827271cb41c65e590e09da3275600c2f09b8367793a9aca3db71cc30c58179ec3e87c14c01d5c1f3434f1d87",
		},
		"A.3 empty salt and info": {
			ikm: bytes.Repeat([]byte{0x0b}, 22), length: 42,
			okm: "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8",
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			got, err := derive(tc.ikm, tc.salt, string(tc.info), tc.length)
			require.NoError(t, err)
			assert.Equal(t, unhex(t, tc.okm), got)
		})
	}
}

func TestDeriveKey(t *testing.T) {
	m := MasterSecret{Key: bytes.Repeat([]byte{1}, 32), Salt: bytes.Repeat([]byte{2}, 32)}
	a, err := m.DeriveKey("c0ffee00-0000-4000-8000-000000000001", 32)
	require.NoError(t, err)
	again, err := m.DeriveKey("c0ffee00-0000-4000-8000-000000000001", 32)
	require.NoError(t, err)
	b, err := m.DeriveKey("c0ffee00-0000-4000-8000-000000000002", 32)
	require.NoError(t, err)
	assert.Equal(t, a, again, "deterministic")
	assert.NotEqual(t, a, b, "per id")

	// The contract: info is "key-" + id, IKM the key, salt the salt.
	want, err := derive(m.Key, m.Salt, "key-measurementSecret", 32)
	require.NoError(t, err)
	ms, err := m.MeasurementSecret()
	require.NoError(t, err)
	assert.Equal(t, want, ms)
	const disk = "c0ffee00-0000-4000-8000-000000000001"
	want, err = derive(m.Key, m.Salt, "key-"+disk, 32)
	require.NoError(t, err)
	diskKey, err := m.StateDiskKey(disk)
	require.NoError(t, err)
	assert.Equal(t, want, diskKey, "a disk key is the derived key of its UUID, 32 bytes")

	for _, bad := range []int{0, -1, MaxDerivedSize + 1} {
		_, err := m.DeriveKey("x", bad)
		assert.ErrorContains(t, err, "out of range")
	}
	_, err = MasterSecret{Key: []byte{1}, Salt: m.Salt}.DeriveKey("x", 32)
	assert.ErrorContains(t, err, "key has 1 bytes")
}

// TestClusterIDMarker compares the verifier's computation (the variant's marker) with what a
// real TPM shows after a node extends the cluster ID into its variant's register.
func TestClusterIDMarker(t *testing.T) {
	m := MasterSecret{Key: bytes.Repeat([]byte{3}, 32), Salt: bytes.Repeat([]byte{4}, 32)}
	ms, err := m.MeasurementSecret()
	require.NoError(t, err)
	id, err := ClusterID(ms, bytes.Repeat([]byte{5}, 32))
	require.NoError(t, err)
	require.Len(t, id, 32)

	tpm := vtpmtest.Simulator(t)
	digest := sha256.Sum256(id)
	reg, ok := variant.QEMUVTPM.ClusterIDRegister()
	require.True(t, ok)
	require.NoError(t, tpm.ExtendPCR(int(reg), digest[:]))
	pcrs, err := tpm.ReadPCRs(int(reg))
	require.NoError(t, err)
	assert.Equal(t, pcrs[reg], variant.QEMUVTPM.ClusterIDMarker(id))

	_, err = ClusterID(nil, []byte{1})
	assert.Error(t, err)
}

func TestMasterSecretFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "constellation-mastersecret.json")
	m, err := NewMasterSecret()
	require.NoError(t, err)
	require.NoError(t, WriteMasterSecretFile(path, m))

	info, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	back, err := ReadMasterSecretFile(path)
	require.NoError(t, err)
	assert.Equal(t, m, back)

	other, err := NewMasterSecret()
	require.NoError(t, err)
	err = WriteMasterSecretFile(path, other)
	assert.ErrorContains(t, err, "refusing to overwrite")
	back, err = ReadMasterSecretFile(path)
	require.NoError(t, err)
	assert.Equal(t, m, back, "the existing secret is untouched")

	for name, content := range map[string]string{
		"unknown field": `{"key":"` + b64(32) + `","salt":"` + b64(32) + `","extra":1}`,
		"short key":     `{"key":"` + b64(16) + `","salt":"` + b64(32) + `"}`,
		"not json":      `key=abc`,
	} {
		p := filepath.Join(dir, name+".json")
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		_, err := ReadMasterSecretFile(p)
		assert.Error(t, err, name)
	}
}

func b64(n int) string { return base64.StdEncoding.EncodeToString(make([]byte, n)) }

// BenchmarkDeriveKey measures one HKDF-SHA256 derivation of a 32-byte key.
func BenchmarkDeriveKey(b *testing.B) {
	m, err := NewMasterSecret()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := m.DeriveKey("3f2504e0-4f89-11d3-9a0c-0305e82c3301", 32); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "keys/s")
}

// A symlink planted at the master secret's name (pointing at a file the attacker can read,
// or at a name it will create) is refused, never followed; nothing is left behind.
func TestAttackMasterSecretFileSymlink(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "constellation-mastersecret.json")
	target := filepath.Join(t.TempDir(), "attacker-readable")
	require.NoError(t, os.Symlink(target, path))
	m, err := NewMasterSecret()
	require.NoError(t, err)
	err = WriteMasterSecretFile(path, m)
	require.ErrorIs(t, err, os.ErrExist)
	assert.ErrorContains(t, err, "refusing to overwrite")
	assert.NoFileExists(t, target, "the symlink was not followed")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, 1, "only the planted symlink, no temporary file")
}

// A volume's key is the derived key of "volume-" + its id, 32 bytes; ids of any other form
// are refused, so no other id space (a disk UUID, the measurement secret) is reachable
// through VolumeKey.
func TestVolumeKey(t *testing.T) {
	m := MasterSecret{Key: bytes.Repeat([]byte{6}, 32), Salt: bytes.Repeat([]byte{7}, 32)}
	const id = "vol-0123456789abcdef0123456789abcdef"
	want, err := derive(m.Key, m.Salt, "key-volume-"+id, 32)
	require.NoError(t, err)
	got, err := m.VolumeKey(id)
	require.NoError(t, err)
	assert.Equal(t, want, got)
	other, err := m.VolumeKey("vol-0123456789abcdef0123456789abcdee")
	require.NoError(t, err)
	assert.NotEqual(t, got, other, "per volume")
	assert.True(t, IsVolumeKeyID("volume-"+id))

	for name, bad := range map[string]string{
		"empty":            "",
		"disk UUID":        "c0ffee00-0000-4000-8000-000000000001",
		"measurement":      MeasurementID,
		"upper case":       "vol-0123456789ABCDEF0123456789ABCDEF",
		"short":            "vol-0123",
		"key id itself":    "volume-" + id,
		"trailing newline": id + "\n",
		"path":             "../" + id,
	} {
		t.Run(name, func(t *testing.T) {
			key, err := m.VolumeKey(bad)
			assert.ErrorContains(t, err, "is not of the form vol-")
			assert.Nil(t, key)
			assert.False(t, IsVolumeKeyID("volume-"+bad))
		})
	}
}
