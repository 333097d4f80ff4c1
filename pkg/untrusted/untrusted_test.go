package untrusted_test

import (
	"fmt"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/pkg/untrusted"
)

// hostile is what a peer sends to take over the operator's terminal: clear the screen, set
// the window title, ring the bell, and start a forged log line.
const hostile = "\x1b[2J\x1b]0;pwned\x07\r\nlevel=ERROR msg=forged"

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

func TestQuoteList(t *testing.T) {
	assert.Equal(t, `[]`, untrusted.QuoteList(nil))
	assert.Equal(t, `["qemu-vtpm", "a\x1bb"]`, untrusted.QuoteList([]string{"qemu-vtpm", "a\x1bb"}))
	many := make([]string, 1000)
	got := untrusted.QuoteList(many)
	assert.Equal(t, `["", "", "", "", "", "", "", "", …(992 more)]`, got)
}

func TestText(t *testing.T) {
	testCases := map[string]struct {
		in   string
		want string
	}{
		"plain":             {in: "wrong init secret", want: "wrong init secret"},
		"empty":             {in: "", want: ""},
		"quotes kept":       {in: `node "worker-0" refused`, want: `node "worker-0" refused`},
		"terminal escapes":  {in: hostile, want: `\x1b[2J\x1b]0;pwned\a\r\nlevel=ERROR msg=forged`},
		"tab":               {in: "a\tb", want: "a b"},
		"C1 control":        {in: "a\u009b2Jb", want: `a\u009b2Jb`},
		"bidi override":     {in: "abc\u202edcba", want: `abc\u202edcba`},
		"line separator":    {in: "a\u2028b", want: `a\u2028b`},
		"invalid UTF-8":     {in: "a\xffb\xc3", want: `a\xffb\xc3`},
		"replacement char":  {in: "a\ufffdb", want: "a\ufffdb"},
		"unicode kept":      {in: "grüße, 世界", want: "grüße, 世界"},
		"exactly the limit": {in: strings.Repeat("a", untrusted.MaxTextBytes), want: strings.Repeat("a", untrusted.MaxTextBytes)},
		"cut":               {in: strings.Repeat("a", untrusted.MaxTextBytes+1), want: strings.Repeat("a", untrusted.MaxTextBytes) + "…(513 bytes)"},
		// An escape is never cut in half: \x1b is 4 bytes, so 128 of them fill the limit.
		"cut between escapes": {in: strings.Repeat("\x1b", 200), want: strings.Repeat(`\x1b`, 128) + "…(200 bytes)"},
		// Nor is a rune.
		"cut between runes": {in: "a" + strings.Repeat("é", 300), want: "a" + strings.Repeat("é", 255) + "…(601 bytes)"},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			got := untrusted.Text(tc.in)
			assert.Equal(t, tc.want, got)
			assertPrintable(t, got)
			assert.LessOrEqual(t, len(got), untrusted.MaxTextBytes+32)
		})
	}
}

func TestLog(t *testing.T) {
	testCases := map[string]struct {
		chunks []string
		want   []string
	}{
		"empty":               {chunks: nil, want: []string{}},
		"lines across chunks": {chunks: []string{"[init] Using Kubernetes v1.34.4\n[preflight] Run", "ning pre-flight checks\n"}, want: []string{"[init] Using Kubernetes v1.34.4", "[preflight] Running pre-flight checks"}},
		"no final newline":    {chunks: []string{"a\nb"}, want: []string{"a", "b"}},
		"CRLF":                {chunks: []string{"a\r\nb\r\n"}, want: []string{"a", "b"}},
		"empty lines kept":    {chunks: []string{"a\n\nb\n"}, want: []string{"a", "", "b"}},
		"escape sequences":    {chunks: []string{hostile + "\n"}, want: []string{`\x1b[2J\x1b]0;pwned\a`, "level=ERROR msg=forged"}},
		"bare CR":             {chunks: []string{"progress 10%\rprogress 100%\n"}, want: []string{`progress 10%\rprogress 100%`}},
		"tab indentation":     {chunks: []string{"\t- 'systemctl status kubelet'\n"}, want: []string{" - 'systemctl status kubelet'"}},
		"long line cut":       {chunks: []string{strings.Repeat("x", 2000) + "\nend\n"}, want: []string{strings.Repeat("x", untrusted.LineBytes) + "…(2000 bytes)", "end"}},
		"invalid UTF-8 line":  {chunks: []string{"\xff\xfe\n"}, want: []string{`\xff\xfe`}},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			var l untrusted.Log
			for _, c := range tc.chunks {
				n, err := l.Write([]byte(c))
				require.NoError(t, err)
				assert.Equal(t, len(c), n)
			}
			assert.Equal(t, tc.want, l.Lines())
		})
	}
}

// A node streaming more than the Log keeps: the last LogBytes bytes stay, and the first line
// says how much was dropped.
func TestLogKeepsTheEnd(t *testing.T) {
	var l untrusted.Log
	for i := range 10000 {
		fmt.Fprintf(&l, "line %05d\n", i) // 11 bytes each
	}
	_, _ = l.Write([]byte(strings.Repeat("y", 3*untrusted.LogBytes)))
	_, _ = l.Write([]byte("\nthe error that made init fail\n"))
	lines := l.Lines()
	require.Len(t, lines, 3)
	assert.Equal(t, fmt.Sprintf("…(%d earlier bytes not kept)", 10000*11+3*untrusted.LogBytes+31-untrusted.LogBytes), lines[0])
	assert.Equal(t, strings.Repeat("y", untrusted.LineBytes)+fmt.Sprintf("…(%d bytes)", untrusted.LogBytes-31), lines[1])
	assert.Equal(t, "the error that made init fail", lines[2])

	var many untrusted.Log
	_, _ = many.Write([]byte(strings.Repeat("\n", untrusted.LogBytes)))
	lines = many.Lines()
	assert.Len(t, lines, untrusted.LogLines+1, "at most LogLines lines, and the note")
	assert.Equal(t, fmt.Sprintf("…(%d earlier bytes not kept)", untrusted.LogBytes-untrusted.LogLines), lines[0])
}

// assertPrintable fails if s has anything a terminal could act on: a control character
// (C0, DEL, C1), a format character (bidi overrides), a line or paragraph separator, or
// invalid UTF-8.
func assertPrintable(t testing.TB, s string) {
	t.Helper()
	if !utf8.ValidString(s) {
		t.Fatalf("invalid UTF-8 in %q", s)
	}
	for _, r := range s {
		if r != ' ' && !unicode.IsPrint(r) {
			t.Fatalf("non-printable %U in %q", r, s)
		}
	}
}

func FuzzQuote(f *testing.F) {
	for _, s := range []string{"", "worker-0", strings.Repeat("\x00", 100), strings.Repeat("é", 40), hostile} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := untrusted.Quote(s)
		if len(got) > 4*untrusted.MaxBytes+32 {
			t.Fatalf("Quote of %d bytes is %d bytes long", len(s), len(got))
		}
		assertPrintable(t, got)
	})
}

func FuzzText(f *testing.F) {
	for _, s := range []string{"", "wrong init secret", hostile, strings.Repeat(hostile, 1000), "\xff\xfe\u202e\u2028\u009b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := untrusted.Text(s)
		if len(got) > untrusted.MaxTextBytes+32 {
			t.Fatalf("Text of %d bytes is %d bytes long", len(s), len(got))
		}
		assertPrintable(t, got)
		if len(s) <= untrusted.MaxTextBytes/4 && !strings.Contains(got, "…(") {
			// Short input is never cut, so printable input comes back unchanged.
			if strings.IndexFunc(s, func(r rune) bool { return r != ' ' && !unicode.IsPrint(r) }) < 0 && utf8.ValidString(s) && got != s {
				t.Fatalf("printable %q became %q", s, got)
			}
		}
	})
}

// FuzzLog streams text in two chunks, as a node streams its log to the CLI: every line Lines
// returns must be safe to print and bounded, and so must their number.
func FuzzLog(f *testing.F) {
	f.Add([]byte("[init] Using Kubernetes v1.34.4\n[preflight] Running pre-flight checks\n"), 10)
	f.Add([]byte(hostile+"\n"+hostile), 3)
	f.Add([]byte(strings.Repeat("a\r\n", 5000)), 7000)
	f.Add([]byte("\xff\xfe\u202e\t\u0085\n\n\n"), 0)
	f.Fuzz(func(t *testing.T, data []byte, split int) {
		if split < 0 || split > len(data) {
			split = len(data) / 2
		}
		var l untrusted.Log
		_, _ = l.Write(data[:split])
		_, _ = l.Write(data[split:])
		lines := l.Lines()
		if len(lines) > untrusted.LogLines+1 {
			t.Fatalf("%d lines", len(lines))
		}
		for _, line := range lines {
			if len(line) > untrusted.LineBytes+32 {
				t.Fatalf("line of %d bytes", len(line))
			}
			assertPrintable(t, line)
		}
	})
}
