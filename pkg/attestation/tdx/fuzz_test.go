package tdx

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-tdx-guest/testing/testdata"
)

// FuzzParseQuote feeds untrusted bytes to the quote parser without ParseQuote's recover,
// so a slice bound go-tdx-guest misses shows up as a crash here instead of being hidden.
func FuzzParseQuote(f *testing.F) {
	f.Add(testdata.RawQuote)
	f.Add(testdata.RawQuote[:1000])
	// Real quote from a COS TDX VM (zero-padded to the provider's buffer).
	cos, err := os.ReadFile(filepath.Join("testdata", "cos-113-tdx-quote.dat"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(cos)
	lying := append([]byte(nil), testdata.RawQuote...)
	binary.LittleEndian.PutUint32(lying[632:], 0xffffffff) // signed data size
	f.Add(lying)
	f.Fuzz(func(t *testing.T, raw []byte) {
		q, err := parseQuote(raw)
		if err != nil {
			return
		}
		if len(q.GetTdQuoteBody().GetReportData()) != 64 || len(q.GetTdQuoteBody().GetRtmrs()) != 4 {
			t.Fatalf("parsed quote with malformed body: %v", q.GetTdQuoteBody())
		}
		if signedEnd(q) > len(raw) {
			t.Fatalf("signed data (%d bytes) beyond the input (%d)", signedEnd(q), len(raw))
		}
	})
}
