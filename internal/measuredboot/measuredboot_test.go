package measuredboot

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"testing"

	"github.com/google/go-eventlog/tcg"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/measuredboot/measuredboottest"
)

// linearAuthenticode is the textbook form of the digest, written independently of
// AuthenticodeSHA256: the whole file without the CheckSum field, the security directory
// entry and the certificate table. It equals the firmware's digest for images whose
// sections follow the headers without gaps, as buildTestPE's and objcopy's do.
func linearAuthenticode(t *testing.T, img []byte) [32]byte {
	t.Helper()
	peOff := binary.LittleEndian.Uint32(img[0x3c:])
	opt := int(peOff) + 24
	checksum := opt + 64
	secDir := opt + 112 + 4*8
	certOff := binary.LittleEndian.Uint32(img[secDir:])
	certLen := binary.LittleEndian.Uint32(img[secDir+4:])
	end := len(img)
	if certLen > 0 {
		require.Equal(t, end, int(certOff+certLen), "test images keep the certificate table at the end")
		end = int(certOff)
	}
	var b bytes.Buffer
	b.Write(img[:checksum])
	b.Write(img[checksum+4 : secDir])
	b.Write(img[secDir+8 : end])
	return sha256.Sum256(b.Bytes())
}

var (
	testKernel  = measuredboottest.PE([]measuredboottest.Section{{Name: ".text", Data: bytes.Repeat([]byte{0x90}, 1000)}}, []byte("certificate table of the kernel!"))
	testCmdline = "console=ttyS0 root=/dev/mapper/root ro roothash=00ff panic=5"
	testOsrel   = []byte("ID=debian\nVERSION_ID=12\n")
	testInitrd  = bytes.Repeat([]byte("initrd"), 300)
)

func TestAuthenticodeSHA256(t *testing.T) {
	plain := measuredboottest.PE([]measuredboottest.Section{{Name: ".text", Data: []byte("code")}, {Name: ".data", Data: bytes.Repeat([]byte{1}, 900)}}, nil)
	signed := measuredboottest.PE([]measuredboottest.Section{{Name: ".text", Data: []byte("code")}, {Name: ".data", Data: bytes.Repeat([]byte{1}, 900)}}, bytes.Repeat([]byte{0xab}, 64))
	withTrailer := append(bytes.Clone(plain), []byte("trailing data after the last section")...)

	tests := map[string]struct {
		img     []byte
		wantErr bool
	}{
		"unsigned image":                  {img: plain},
		"signed image":                    {img: signed},
		"trailing data, no certificate":   {img: withTrailer},
		"UKI of synthetic sections":       {img: measuredboottest.UKI(testOsrel, []byte(testCmdline), testKernel, testInitrd)},
		"empty":                           {img: nil, wantErr: true},
		"no MZ":                           {img: append([]byte("ZM"), plain[2:]...), wantErr: true},
		"truncated in the headers":        {img: plain[:200], wantErr: true},
		"truncated in a section":          {img: plain[:len(plain)-10], wantErr: true},
		"certificate larger than trailer": {img: signed[:len(signed)-8], wantErr: true},
		"PE offset beyond the file": {img: func() []byte {
			b := bytes.Clone(plain)
			binary.LittleEndian.PutUint32(b[0x3c:], 0xfffffff0)
			return b
		}(), wantErr: true},
		"bad optional header magic": {img: func() []byte {
			b := bytes.Clone(plain)
			b[0x40+24] = 0x99
			return b
		}(), wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := AuthenticodeSHA256(tc.img)
			if tc.wantErr {
				require.ErrorIs(t, err, ErrMalformedPE)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, linearAuthenticode(t, tc.img), got)
		})
	}

	t.Run("signing does not change the digest", func(t *testing.T) {
		a, err := AuthenticodeSHA256(plain)
		require.NoError(t, err)
		b, err := AuthenticodeSHA256(signed)
		require.NoError(t, err)
		assert.Equal(t, a, b)
	})
	t.Run("the checksum is not covered", func(t *testing.T) {
		b := bytes.Clone(plain)
		b[0x40+24+64] ^= 0xff
		x, _ := AuthenticodeSHA256(plain)
		y, err := AuthenticodeSHA256(b)
		require.NoError(t, err)
		assert.Equal(t, x, y)
	})
	t.Run("section bytes are covered", func(t *testing.T) {
		b := bytes.Clone(plain)
		b[len(b)-1] ^= 0xff
		x, _ := AuthenticodeSHA256(plain)
		y, err := AuthenticodeSHA256(b)
		require.NoError(t, err)
		assert.NotEqual(t, x, y)
	})
}

func TestParseUKI(t *testing.T) {
	good := []measuredboottest.Section{
		{Name: ".text", Data: []byte("stub")},
		{Name: ".osrel", Data: testOsrel},
		{Name: ".cmdline", Data: []byte(testCmdline)},
		{Name: ".linux", Data: testKernel},
		{Name: ".initrd", Data: testInitrd},
	}
	with := func(change func([]measuredboottest.Section) []measuredboottest.Section) []byte {
		s := append([]measuredboottest.Section(nil), good...)
		return measuredboottest.PE(change(s), nil)
	}
	tests := map[string]struct {
		raw     []byte
		wantErr string
	}{
		"UKI":      {raw: with(func(s []measuredboottest.Section) []measuredboottest.Section { return s })},
		"not a PE": {raw: []byte("not a PE file at all"), wantErr: "malformed UKI"},
		"section name systemd-stub reads as .linux": {raw: with(func(s []measuredboottest.Section) []measuredboottest.Section {
			return append(s, measuredboottest.Section{Name: ".linuxAB", Data: []byte("x")})
		}), wantErr: `section ".linuxAB" would be read by systemd-stub as .linux`},
		"section given twice": {raw: with(func(s []measuredboottest.Section) []measuredboottest.Section {
			return append(s, measuredboottest.Section{Name: ".initrd", Data: []byte("second initrd")})
		}), wantErr: "section .initrd given twice"},
		"no initrd": {raw: with(func(s []measuredboottest.Section) []measuredboottest.Section { return s[:4] }), wantErr: "no .initrd section"},
		"VirtualSize beyond raw data": {raw: with(func(s []measuredboottest.Section) []measuredboottest.Section {
			s[1] = measuredboottest.Section{Name: ".osrel", Data: testOsrel, VirtualSize: 0x10000}
			return s
		}), wantErr: "VirtualSize 65536 beyond"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			u, err := ParseUKI(tc.raw)
			if tc.wantErr != "" {
				require.ErrorIs(t, err, ErrMalformedUKI)
				assert.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			// Sections are VirtualSize long, without the file alignment's padding.
			assert.Equal(t, testOsrel, u.Sections[".osrel"])
			assert.Equal(t, testKernel, u.Sections[".linux"])
			assert.Equal(t, testInitrd, u.Sections[".initrd"])
		})
	}
}

func TestCmdline(t *testing.T) {
	tests := map[string]struct {
		section string
		want    string
		wantErr string
	}{
		"plain":                 {section: testCmdline, want: testCmdline},
		"NUL-terminated":        {section: testCmdline + "\x00\x00", want: testCmdline},
		"trailing newline":      {section: testCmdline + "\n", wantErr: "not printable ASCII"},
		"trailing space":        {section: testCmdline + " ", wantErr: "ends with a space"},
		"empty":                 {section: "\x00", wantErr: "empty .cmdline"},
		"non-ASCII":             {section: "root=/dev/vda\xc3\xa9", wantErr: "not printable ASCII"},
		"bytes after a NUL cut": {section: "ro\x00console=ttyS0", want: "ro"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			u := &UKI{Sections: map[string][]byte{".cmdline": []byte(tc.section)}}
			got, err := u.Cmdline()
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

// TestPredictPCR9 checks the command-line and initrd digests against values computed here
// independently: UTF-16LE of an ASCII string is each byte followed by a zero byte.
func TestPredictPCR9(t *testing.T) {
	u, err := ParseUKI(measuredboottest.UKI(testOsrel, []byte(testCmdline), testKernel, testInitrd))
	require.NoError(t, err)
	events, err := PredictPCR9(u)
	require.NoError(t, err)
	require.Len(t, events, 2)

	var wide []byte
	for _, c := range []byte(testCmdline) {
		wide = append(wide, c, 0)
	}
	wide = append(wide, 0, 0)
	assert.Equal(t, sha256.Sum256(wide), events[0].Digest)
	assert.Equal(t, sha256.Sum256(testInitrd), events[1].Digest)
	for _, e := range events {
		assert.Equal(t, tcg.EventTag, e.Type)
		assert.EqualValues(t, 9, e.PCR)
	}
	p, err := PredictUKI(measuredboottest.UKI(testOsrel, []byte(testCmdline), testKernel, testInitrd))
	require.NoError(t, err)
	want := extend(extend([32]byte{}, sha256.Sum256(wide)), sha256.Sum256(testInitrd))
	assert.Equal(t, want, p.Value(9))
}

func TestPredictPCR4(t *testing.T) {
	raw := measuredboottest.UKI(testOsrel, []byte(testCmdline), testKernel, testInitrd)
	u, err := ParseUKI(raw)
	require.NoError(t, err)
	events, err := PredictPCR4(u)
	require.NoError(t, err)
	require.Len(t, events, 4)
	assert.Equal(t, []tcg.EventType{tcg.EFIAction, tcg.Separator, tcg.EFIBootServicesApplication, tcg.EFIBootServicesApplication},
		[]tcg.EventType{events[0].Type, events[1].Type, events[2].Type, events[3].Type})
	assert.Equal(t, sha256.Sum256([]byte("Calling EFI Application from Boot Option")), events[0].Digest)
	assert.Equal(t, sha256.Sum256([]byte{0, 0, 0, 0}), events[1].Digest)
	assert.Equal(t, linearAuthenticode(t, raw), events[2].Digest)
	assert.Equal(t, linearAuthenticode(t, testKernel), events[3].Digest)
}

func TestPredictPCR11(t *testing.T) {
	raw := measuredboottest.PE([]measuredboottest.Section{
		{Name: ".text", Data: []byte("stub")},
		// File order differs from systemd-stub's measuring order on purpose.
		{Name: ".initrd", Data: testInitrd},
		{Name: ".pcrsig", Data: []byte(`{"sha256":[]}`)},
		{Name: ".cmdline", Data: []byte(testCmdline)},
		{Name: ".linux", Data: testKernel},
		{Name: ".osrel", Data: testOsrel},
	}, nil)
	u, err := ParseUKI(raw)
	require.NoError(t, err)
	events := PredictPCR11(u)
	var want [32]byte
	for _, s := range []struct {
		name string
		data []byte
	}{{".linux", testKernel}, {".osrel", testOsrel}, {".cmdline", []byte(testCmdline)}, {".initrd", testInitrd}} {
		want = extend(want, sha256.Sum256([]byte(s.name+"\x00")))
		want = extend(want, sha256.Sum256(s.data))
	}
	require.Len(t, events, 8, ".pcrsig is not measured")
	assert.Equal(t, want, replay(events))
}

// TestPredictIMA checks the boot_aggregate template digest against the byte layout
// assembled by hand: d-ng (40 bytes), n-ng (15 bytes), an empty sig field.
func TestPredictIMA(t *testing.T) {
	var pcrs [10][32]byte
	for i := range pcrs {
		pcrs[i] = sha256.Sum256([]byte{byte(i)})
	}
	var all []byte
	for _, p := range pcrs {
		all = append(all, p[:]...)
	}
	agg := sha256.Sum256(all)
	tmpl := []byte{40, 0, 0, 0}
	tmpl = append(tmpl, "sha256:\x00"...)
	tmpl = append(tmpl, agg[:]...)
	tmpl = append(tmpl, 15, 0, 0, 0)
	tmpl = append(tmpl, "boot_aggregate\x00"...)
	tmpl = append(tmpl, 0, 0, 0, 0)
	e := PredictIMA(pcrs)
	assert.Equal(t, sha256.Sum256(tmpl), e.Digest)
	assert.EqualValues(t, 10, e.PCR)
}
