// Package untrusted formats strings that come from a peer for errors and logs. A peer
// controls their length and content: echoed whole, a 1 MiB "disk UUID" becomes a 1 MiB gRPC
// status and log line, and control characters or quotes in it could forge log fields.
package untrusted

import (
	"fmt"
	"strconv"
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
