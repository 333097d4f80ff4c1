package untrusted_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/openconstellation/constellation/internal/untrusted"
)

func TestQuote(t *testing.T) {
	testCases := map[string]struct {
		in   string
		want string
	}{
		"short":           {in: "worker-0", want: `"worker-0"`},
		"empty":           {in: "", want: `""`},
		"exactly 64":      {in: strings.Repeat("a", 64), want: `"` + strings.Repeat("a", 64) + `"`},
		"1 MiB":           {in: strings.Repeat("a", 1<<20), want: `"` + strings.Repeat("a", 64) + `"…(1048576 bytes)`},
		"control chars":   {in: "a\nlevel=ERROR msg=forged", want: `"a\nlevel=ERROR msg=forged"`},
		"cut before rune": {in: strings.Repeat("a", 63) + "é" + strings.Repeat("b", 10), want: `"` + strings.Repeat("a", 63) + `"…(75 bytes)`},
		"invalid UTF-8":   {in: "\xff\xfe", want: `"\xff\xfe"`},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			got := untrusted.Quote(tc.in)
			assert.Equal(t, tc.want, got)
			assert.LessOrEqual(t, len(got), 4*untrusted.MaxBytes+32)
		})
	}
}

func FuzzQuote(f *testing.F) {
	for _, s := range []string{"", "worker-0", strings.Repeat("\x00", 100), strings.Repeat("é", 40)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := untrusted.Quote(s)
		if len(got) > 4*untrusted.MaxBytes+32 {
			t.Fatalf("Quote of %d bytes is %d bytes long", len(s), len(got))
		}
		if strings.ContainsAny(got, "\n\r") {
			t.Fatalf("Quote leaves a line break: %q", got)
		}
	})
}
