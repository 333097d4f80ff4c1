package vhd

import (
	"encoding/binary"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestFooterAgainstQemuImg compares the footer with the one qemu-img writes for a fixed VHD
// of the same size (qemu-img convert -O vpc -o subformat=fixed,force_size): every field but
// the ones that name the writer, the time and the disk, and the checksum over them.
func TestFooterAgainstQemuImg(t *testing.T) {
	if testing.Short() {
		t.Skip("runs qemu-img")
	}
	for _, size := range []int64{Alignment, 30 * Alignment, 2 << 30, 130 << 30} {
		raw := filepath.Join(t.TempDir(), "disk.raw")
		require.NoError(t, os.WriteFile(raw, nil, 0o644))
		require.NoError(t, os.Truncate(raw, size))
		out := raw + ".vhd"
		cmd := exec.Command("qemu-img", "convert", "-f", "raw", "-O", "vpc", "-o", "subformat=fixed,force_size=on", raw, out)
		msg, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", msg)
		want := lastSector(t, out, size)

		got, err := Footer(size, time.Now(), [16]byte{1})
		require.NoError(t, err)
		for _, field := range []struct {
			name     string
			from, to int
		}{
			{"cookie", 0, 8}, {"features", 8, 12}, {"version", 12, 16}, {"data offset", 16, 24},
			{"creator host OS", 36, 40}, {"original size", 40, 48}, {"current size", 48, 56},
			{"geometry", 56, 60}, {"disk type", 60, 64}, {"saved state and reserved", 84, 512},
		} {
			assert.Equal(t, want[field.from:field.to], got[field.from:field.to], "%s of a %d-byte disk", field.name, size)
		}
		// Both checksums are right for their footers.
		var wantArr [FooterSize]byte
		copy(wantArr[:], want)
		assert.Equal(t, binary.BigEndian.Uint32(want[64:68]), checksum(wantArr))
		assert.Equal(t, binary.BigEndian.Uint32(got[64:68]), checksum(got))
	}
}

func TestFooterRefusesUnalignedSizes(t *testing.T) {
	for _, size := range []int64{0, -Alignment, Alignment + 512} {
		_, err := Footer(size, time.Now(), [16]byte{})
		assert.ErrorContains(t, err, "multiple of 1048576 bytes", size)
	}
	assert.Equal(t, int64(2*Alignment), AlignedSize(Alignment+1))
	assert.Equal(t, int64(Alignment), AlignedSize(Alignment))
}

func TestFooterTimestamp(t *testing.T) {
	f, err := Footer(Alignment, time.Date(2000, 1, 1, 0, 1, 40, 0, time.UTC), [16]byte{})
	require.NoError(t, err)
	assert.Equal(t, uint32(100), binary.BigEndian.Uint32(f[24:28]))
}

// lastSector reads the footer of the VHD at path, whose disk has size bytes (the file is
// sparse: only the footer is read).
func lastSector(t *testing.T, path string, size int64) []byte {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	info, err := f.Stat()
	require.NoError(t, err)
	require.Equal(t, size+FooterSize, info.Size())
	out := make([]byte, FooterSize)
	_, err = f.ReadAt(out, size)
	require.NoError(t, err)
	return out
}

// TestQemuImgReadsOurVHD: a raw disk with our footer is a fixed VHD of the disk's size to
// qemu-img (told the format: a fixed VHD has no header to probe), which reads its size from
// the footer.
func TestQemuImgReadsOurVHD(t *testing.T) {
	if testing.Short() {
		t.Skip("runs qemu-img")
	}
	const size = 3 * Alignment
	path := filepath.Join(t.TempDir(), "disk.vhd")
	f, err := Footer(size, time.Now(), [16]byte{7})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, append(make([]byte, size), f[:]...), 0o644))
	out, err := exec.Command("qemu-img", "info", "-f", "vpc", "--output=json", path).CombinedOutput()
	require.NoError(t, err, "%s", out)
	var info struct {
		Format      string `json:"format"`
		VirtualSize int64  `json:"virtual-size"`
	}
	require.NoError(t, json.Unmarshal(out, &info))
	assert.Equal(t, "vpc", info.Format)
	assert.Equal(t, int64(size), info.VirtualSize)
}
