package vmnode

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/csidriver"
)

const volID = "vol-0123456789abcdef0123456789abcdef"

func vpd(serial string) []byte {
	return append([]byte{0, 0x80, 0, byte(len(serial))}, serial...)
}

func TestParseVPDSerial(t *testing.T) {
	for name, tc := range map[string]struct {
		page []byte
		want string
		err  string
	}{
		"qemu":       {page: vpd(volID), want: volID},
		"padded":     {page: vpd("  " + volID + "  "), want: volID},
		"short":      {page: []byte{0, 0x80, 0}, err: "shorter than its header"},
		"other page": {page: []byte{0, 0x83, 0, 0}, err: "want the unit serial number page"},
		"truncated":  {page: []byte{0, 0x80, 0, 9, 'a'}, err: "declares 9 bytes, has 1"},
		"binary":     {page: vpd("vol\n1"), err: "not printable"},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := ParseVPDSerial(tc.page)
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func FuzzParseVPDSerial(f *testing.F) {
	f.Add(vpd(volID))
	f.Add([]byte{0, 0x80, 0xff, 0xff})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, page []byte) {
		s, err := ParseVPDSerial(page)
		if err == nil && len(s) > len(page) {
			t.Fatalf("serial %q longer than its page", s)
		}
	})
}

// fakeProvider is the provider's volume API: attached or not.
type fakeProvider struct{ err error }

func (f fakeProvider) Device(context.Context, string) (string, error) {
	return "/host/volumes/" + volID + ".img", f.err
}

// sysDisk adds a block device with an optional serial to a fake /sys/block.
func sysDisk(t *testing.T, sys, name, serial string) {
	t.Helper()
	dir := filepath.Join(sys, name, "device")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	if serial != "" {
		require.NoError(t, os.WriteFile(filepath.Join(dir, "vpd_pg80"), vpd(serial), 0o644))
	}
}

// The node opens the disk with the volume's serial, never a path the host names; it waits
// for a disk just plugged, and refuses to choose between two.
func TestMachineDisks(t *testing.T) {
	ctx := context.Background()
	newDisks := func(sys string, p csidriver.Devices) *machineDisks {
		return &machineDisks{provider: p, sysBlock: sys, wait: 5 * time.Second, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	}

	sys := t.TempDir()
	sysDisk(t, sys, "vda", "")
	sysDisk(t, sys, "sda", "vol-ffffffffffffffffffffffffffffffff")
	go func() {
		// Not sysDisk: require must not stop the test from another goroutine.
		time.Sleep(300 * time.Millisecond)
		dir := filepath.Join(sys, "sdb", "device")
		if os.MkdirAll(dir, 0o755) == nil {
			_ = os.WriteFile(filepath.Join(dir, "vpd_pg80"), vpd(volID), 0o644)
		}
	}()
	dev, err := newDisks(sys, fakeProvider{}).Device(ctx, volID)
	require.NoError(t, err)
	assert.Equal(t, "/dev/sdb", dev, "the disk that appeared after the plug")

	_, err = newDisks(sys, fakeProvider{err: csidriver.ErrNotAttached}).Device(ctx, volID)
	assert.ErrorIs(t, err, csidriver.ErrNotAttached, "the provider's refusal is the answer")

	none := newDisks(t.TempDir(), fakeProvider{})
	none.wait = 300 * time.Millisecond
	_, err = none.Device(ctx, volID)
	assert.ErrorContains(t, err, "no disk with its serial number appeared")

	sysDisk(t, sys, "sdc", volID)
	_, err = newDisks(sys, fakeProvider{}).Device(ctx, volID)
	assert.ErrorContains(t, err, "refusing to pick one")
	assert.False(t, errors.Is(err, csidriver.ErrNotAttached))
}
