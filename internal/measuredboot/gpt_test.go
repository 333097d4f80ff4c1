package measuredboot

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/measuredboot/measuredboottest"
)

// vmImageGPT is the first 34 sectors of a node OS image (make vm-image) whose boot was
// quoted: PCR 5 of that boot read quotedPCR5 (firmware/ovmf-2022.11-...json's source).
const (
	vmImageGPT = "testdata/vm-image-gpt.bin"
	quotedPCR5 = "e2325f386ae1d16d59aa7c8e5a21c3e2f9764d71dd9e6b9a70765b1b44ac0767"
)

func TestPredictPCR5EqualsAQuotedBoot(t *testing.T) {
	raw, err := os.ReadFile(vmImageGPT)
	require.NoError(t, err)
	events, err := PredictPCR5(bytes.NewReader(raw))
	require.NoError(t, err)
	require.Len(t, events, 4)
	assert.Equal(t, "EV_EFI_GPT_EVENT", events[1].Type.TCGString())
	assert.Equal(t, quotedPCR5, hex.EncodeToString(valueOf(events)))
}

func valueOf(events []Event) []byte {
	v := replay(events)
	return v[:]
}

func TestGPTEventData(t *testing.T) {
	data, err := GPTEventData(bytes.NewReader(measuredboottest.GPT(0, 1, 5)))
	require.NoError(t, err)
	require.Len(t, data, 92+8+3*128, "header, count, the used entries only")
	assert.Equal(t, uint64(3), binary.LittleEndian.Uint64(data[92:]))
	assert.Equal(t, byte(6), data[100+2*128], "entry 5 follows entry 1: empty slots are left out, order kept")

	// Two disks that differ only in an unused entry's bytes beyond the type GUID measure
	// the same; a used entry's change measures differently.
	a, b := measuredboottest.GPT(0), measuredboottest.GPT(0)
	b[2*512+128+40] = 1 // entry 1 unused: its type GUID is zero
	measuredboottest.FixCRCs(b)
	da, err := GPTEventData(bytes.NewReader(a))
	require.NoError(t, err)
	db, err := GPTEventData(bytes.NewReader(b))
	require.NoError(t, err)
	assert.Equal(t, da[92:], db[92:])
	c := measuredboottest.GPT(0)
	c[2*512+40] = 1 // entry 0's first LBA
	measuredboottest.FixCRCs(c)
	dc, err := GPTEventData(bytes.NewReader(c))
	require.NoError(t, err)
	assert.NotEqual(t, da[92:], dc[92:])
}

func TestGPTEventDataRefuses(t *testing.T) {
	for name, tc := range map[string]struct {
		mutate func(d []byte)
		want   string
	}{
		"no signature":          {func(d []byte) { d[512] = 'X' }, "signature"},
		"header CRC":            {func(d []byte) { d[512+24] = 9 }, "header CRC32"},
		"entry array CRC":       {func(d []byte) { d[2*512+100] = 9 }, "entry array CRC32"},
		"header size too small": {func(d []byte) { binary.LittleEndian.PutUint32(d[512+12:], 40); measuredboottest.FixCRCs(d) }, "header size"},
		"no entries":            {func(d []byte) { binary.LittleEndian.PutUint32(d[512+80:], 0); measuredboottest.FixCRCs(d) }, "partition entries"},
		"huge entry count":      {func(d []byte) { binary.LittleEndian.PutUint32(d[512+80:], 1<<30); measuredboottest.FixCRCs(d) }, "partition entries"},
		"odd entry size":        {func(d []byte) { binary.LittleEndian.PutUint32(d[512+84:], 100); measuredboottest.FixCRCs(d) }, "entry size"},
		"entries past the end":  {func(d []byte) { binary.LittleEndian.PutUint64(d[512+72:], 1000); measuredboottest.FixCRCs(d) }, "reading 128 GPT partition entries"},
	} {
		t.Run(name, func(t *testing.T) {
			d := measuredboottest.GPT(0, 1)
			tc.mutate(d)
			_, err := GPTEventData(bytes.NewReader(d))
			assert.ErrorContains(t, err, tc.want)
		})
	}
	_, err := GPTEventData(bytes.NewReader(make([]byte, 100)))
	assert.ErrorContains(t, err, "LBA 1")
}

// TestGPTEventDataOfSfdisk reads a table util-linux's sfdisk wrote: the used entries it
// reports are the ones measured, in order.
func TestGPTEventDataOfSfdisk(t *testing.T) {
	if testing.Short() {
		t.Skip("runs sfdisk")
	}
	_, err := exec.LookPath("sfdisk")
	require.NoError(t, err, "sfdisk (util-linux) is needed")
	img := filepath.Join(t.TempDir(), "disk.raw")
	require.NoError(t, os.WriteFile(img, nil, 0o600))
	require.NoError(t, os.Truncate(img, 64<<20))
	layout := "label: gpt\nsize=8MiB, type=C12A7328-F81F-11D2-BA4B-00A0C93EC93B, name=esp\nsize=16MiB, type=4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709, name=root\ntype=2C7357ED-EBD2-46D9-AEC1-23D437EC2BF5, name=root-verity\n"
	cmd := exec.Command("sfdisk", "--no-reread", "--no-tell-kernel", img)
	cmd.Stdin = strings.NewReader(layout)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)

	f, err := os.Open(img)
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	data, err := GPTEventData(f)
	require.NoError(t, err)
	require.Equal(t, uint64(3), binary.LittleEndian.Uint64(data[92:]))
	// The second used entry's type GUID, mixed-endian as GPT stores GUIDs.
	rootType, _ := hex.DecodeString("e3bc684fcde8b14d96e7fbcaf984b709")
	assert.Equal(t, rootType, data[100+128:100+128+16])
}

func FuzzGPTEventData(f *testing.F) {
	f.Add(measuredboottest.GPT(0, 1, 2))
	if raw, err := os.ReadFile(vmImageGPT); err == nil {
		f.Add(raw)
	}
	f.Add(make([]byte, 1024))
	f.Fuzz(func(t *testing.T, disk []byte) {
		data, err := GPTEventData(bytes.NewReader(disk))
		if err == nil && len(data) < 100 {
			t.Fatalf("accepted a table of %d bytes", len(data))
		}
	})
}
