// Package untrusted formats strings that come from a peer for errors, logs and terminals. A
// peer controls their length and content: echoed whole, a 1 MiB "disk UUID" becomes a 1 MiB
// gRPC status and log line, control characters or quotes in it could forge log fields, and
// terminal escape sequences (ESC [ 2 J, OSC titles) would act on the operator's terminal.
//
// Four shapes, one escaping rule (every rune that is not printable, invalid UTF-8 included, is
// written as a Go escape such as \x1b, \n or \u202e; tabs become spaces):
//
//   - Quote: a name or identifier, Go-quoted, its first MaxBytes bytes;
//   - QuoteList: a list of names, each quoted, at most MaxListItems of them;
//   - Text: a free-text message (an abort reason, a server's error message), one line, at most
//     MaxTextBytes;
//   - Log: multi-line text a peer streams (a node's kubeadm output), kept bounded and rendered
//     one escaped line at a time.
//
// untrustedgrpc.Status applies Text to the message of a gRPC status a server sent, keeping
// its code (a package of its own, so that this one does not import gRPC).
//
// This package is public because pkg/atls and pkg/verify, which verifiers outside this module
// import, need it as much as the internal packages do.
package untrusted

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxBytes is how much of a peer's string Quote keeps.
const MaxBytes = 64

// Quote returns s as a Go-quoted string (control characters and invalid UTF-8 escaped), cut
// to its first MaxBytes bytes (never inside a UTF-8 sequence) with the original length noted:
// "3f2504e0-…"…(1048576 bytes). The result is at most 4*MaxBytes+32 bytes long.
func Quote(s string) string {
	if len(s) <= MaxBytes {
		return strconv.Quote(s)
	}
	cut := MaxBytes
	for cut > MaxBytes-utf8.UTFMax && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s…(%d bytes)", strconv.Quote(s[:cut]), len(s))
}

// MaxListItems is how many names QuoteList shows.
const MaxListItems = 8

// QuoteList returns the names Quoted, comma-separated in brackets; past MaxListItems names it
// shows the first ones and how many it left out: ["a", "b", …(998 more)].
func QuoteList(names []string) string {
	var b strings.Builder
	b.WriteByte('[')
	for i, n := range names {
		if i == MaxListItems {
			fmt.Fprintf(&b, ", …(%d more)", len(names)-i)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(Quote(n))
	}
	b.WriteByte(']')
	return b.String()
}

// MaxTextBytes bounds the escaped text Text keeps of a message.
const MaxTextBytes = 512

// Text returns s as one line safe to print: every non-printable rune escaped (see the package
// documentation), not quoted, so a server's message reads as it was meant. When the escaped
// text exceeds MaxTextBytes it is cut there and the original length noted: the result is at
// most MaxTextBytes+32 bytes long and contains no control characters.
func Text(s string) string {
	var b strings.Builder
	escape(&b, s, MaxTextBytes)
	return b.String()
}

// escape writes s to b with every non-printable rune escaped, at most limit bytes of it; if
// it had to cut, it notes s's length after what it wrote.
func escape(b *strings.Builder, s string, limit int) {
	start := b.Len()
	for i, r := range s {
		piece := ""
		switch {
		case r == utf8.RuneError && !strings.HasPrefix(s[i:], string(utf8.RuneError)):
			piece = fmt.Sprintf(`\x%02x`, s[i]) // one byte of invalid UTF-8
		case r == '\t':
			piece = " "
		case r == ' ' || unicode.IsPrint(r):
			piece = s[i : i+utf8.RuneLen(r)]
		default:
			q := strconv.QuoteRune(r) // '\x1b', '\n', '\u202e'
			piece = q[1 : len(q)-1]
		}
		if b.Len()-start+len(piece) > limit {
			fmt.Fprintf(b, "…(%d bytes)", len(s))
			return
		}
		b.WriteString(piece)
	}
}

// Limits of Log.
const (
	// LogBytes is how much of the text written to a Log it keeps: the last LogBytes bytes
	// (the end of a failed kubeadm run is what says why it failed).
	LogBytes = 16 << 10
	// LogLines is how many lines Lines returns at most: the last ones.
	LogLines = 200
	// LineBytes bounds the escaped text of one line, as MaxTextBytes bounds Text's.
	LineBytes = 512
)

// Log collects multi-line text a peer streams in chunks, such as a node's log, for printing:
// it keeps only the last LogBytes bytes written, and Lines renders them one escaped line at a
// time. The zero value is ready to use; a Log is not safe for concurrent use.
type Log struct {
	buf     []byte
	dropped int64
}

// Write keeps the last LogBytes bytes of what was written so far. It never fails.
func (l *Log) Write(p []byte) (int, error) {
	n := len(p)
	if len(p) >= LogBytes {
		l.dropped += int64(len(l.buf) + len(p) - LogBytes)
		l.buf = append(l.buf[:0], p[len(p)-LogBytes:]...)
		return n, nil
	}
	if over := len(l.buf) + len(p) - LogBytes; over > 0 {
		l.dropped += int64(over)
		l.buf = append(l.buf[:0], l.buf[over:]...)
	}
	l.buf = append(l.buf, p...)
	return n, nil
}

// Lines returns what the Log kept as lines safe to print one by one: split at line feeds
// (a CR before one is dropped), every other control character and invalid UTF-8 escaped, each
// line cut at LineBytes (and its length noted), at most the last LogLines lines. When text was
// dropped, the first line says how much. No line contains a control character; none is
// longer than LineBytes+32 bytes.
func (l *Log) Lines() []string {
	text := string(l.buf)
	text = strings.TrimSuffix(text, "\n")
	var raw []string
	if text != "" {
		raw = strings.Split(text, "\n")
	}
	dropped := l.dropped
	if len(raw) > LogLines {
		for _, r := range raw[:len(raw)-LogLines] {
			dropped += int64(len(r) + 1)
		}
		raw = raw[len(raw)-LogLines:]
	}
	out := make([]string, 0, len(raw)+1)
	if dropped > 0 {
		out = append(out, fmt.Sprintf("…(%d earlier bytes not kept)", dropped))
	}
	for _, r := range raw {
		var b strings.Builder
		escape(&b, strings.TrimSuffix(r, "\r"), LineBytes)
		out = append(out, b.String())
	}
	return out
}
