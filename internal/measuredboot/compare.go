package measuredboot

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"unicode/utf16"

	"github.com/google/go-eventlog/tcg"

	"github.com/openconstellation/constellation/pkg/attestation/eventlog"
)

// RegisterMismatch says that a quoted register differs from its prediction, and which
// event first differs: the predicted event at Index and the logged one (either may be
// absent when one sequence is longer).
type RegisterMismatch struct {
	PCR       uint32
	Predicted [sha256.Size]byte
	// Quoted is nil when the quote does not cover the register.
	Quoted []byte
	// Index is the position, among the register's events, of the first differing event; -1
	// when every event matched but the quote still differs (the quote and the log disagree
	// only if the log did not replay, which CheckEventLog checks first).
	Index    int
	Expected *Event
	Observed *eventlog.Event
}

func (m *RegisterMismatch) Error() string {
	var b strings.Builder
	if m.Quoted == nil {
		fmt.Fprintf(&b, "PCR %d is not covered by the quote (predicted %x)", m.PCR, m.Predicted)
		return b.String()
	}
	fmt.Fprintf(&b, "PCR %d is %x, predicted %x", m.PCR, m.Quoted, m.Predicted)
	switch {
	case m.Index < 0:
		b.WriteString("; its logged events match the prediction")
	case m.Expected != nil && m.Observed != nil:
		fmt.Fprintf(&b, "; event %d of PCR %d differs: expected %s, observed %s", m.Index, m.PCR, m.Expected, describeLogged(*m.Observed))
	case m.Expected != nil:
		fmt.Fprintf(&b, "; event %d of PCR %d is missing: expected %s, the log ends", m.Index, m.PCR, m.Expected)
	default:
		fmt.Fprintf(&b, "; event %d of PCR %d is unexpected: observed %s, the prediction ends", m.Index, m.PCR, describeLogged(*m.Observed))
	}
	return b.String()
}

// CheckEventLog checks a booted node's evidence against a prediction. quoted holds the
// SHA-256 PCR values from a verified quote; rawLog is the node's TCG event log
// (binary_bios_measurements), untrusted until it replays.
//
//  1. Parse and replay: the log must replay to the quoted value of every register it has
//     events for (pkg/attestation/eventlog.Replay).
//  2. Compare: each predicted register must be quoted and equal its predicted value. For
//     each one that differs, the error (a *RegisterMismatch per register, joined) names the
//     register and the first event where the replayed log departs from the prediction.
func CheckEventLog(p *Prediction, rawLog []byte, quoted map[uint32][]byte) error {
	log, err := eventlog.Replay(rawLog, quoted)
	if err != nil {
		return fmt.Errorf("event log: %w", err)
	}
	logged := map[uint32][]eventlog.Event{}
	for _, e := range log.Events() {
		if e.Type == tcg.NoAction { // not extended: informational only
			continue
		}
		logged[e.PCR] = append(logged[e.PCR], e)
	}
	var errs []error
	for _, pcr := range p.Registers() {
		want := p.Value(pcr)
		got, ok := quoted[pcr]
		if ok && bytes.Equal(got, want[:]) {
			continue
		}
		m := &RegisterMismatch{PCR: pcr, Predicted: want, Index: -1}
		if ok {
			m.Quoted = bytes.Clone(got)
			m.Index, m.Expected, m.Observed = firstDifference(p.Events[pcr], logged[pcr])
		}
		errs = append(errs, m)
	}
	return errors.Join(errs...)
}

// firstDifference returns the first position where the predicted and the logged events
// differ in type or digest, with the two events there (nil past the end of either), or -1
// if none does.
func firstDifference(want []Event, got []eventlog.Event) (int, *Event, *eventlog.Event) {
	for i := 0; i < len(want) || i < len(got); i++ {
		var w *Event
		var g *eventlog.Event
		if i < len(want) {
			w = &want[i]
		}
		if i < len(got) {
			g = &got[i]
		}
		if w != nil && g != nil && w.Type == g.Type && bytes.Equal(w.Digest[:], g.Digest) {
			continue
		}
		return i, w, g
	}
	return -1, nil, nil
}

// describeLogged renders a logged event for a message. Its data is untrusted (for most
// types not bound to the digest): it is shown as a quoted, bounded string, never parsed
// beyond that.
func describeLogged(e eventlog.Event) string {
	return fmt.Sprintf("%s %x (%s)", e.Type.TCGString(), e.Digest, describeData(e.Type, e.Data))
}

const maxDescription = 120

func describeData(typ tcg.EventType, data []byte) string {
	switch typ {
	case tcg.EFIBootServicesApplication, tcg.EFIBootServicesDriver, tcg.EFIRuntimeServicesDriver:
		// UEFI_IMAGE_LOAD_EVENT: location, length, link-time address, device-path length.
		if len(data) >= 32 {
			return fmt.Sprintf("EFI image of %d bytes", binary.LittleEndian.Uint64(data[8:16]))
		}
	case tcg.Ipl, tcg.EventTag, tcg.EFIAction:
		if s, ok := printable(data); ok {
			return fmt.Sprintf("%q", s)
		}
	}
	return fmt.Sprintf("%d bytes of event data", len(data))
}

// printable decodes event data as ASCII or as UTF-16LE (systemd-stub logs UTF-16), bounded
// and without the trailing NUL, if it is printable text.
func printable(data []byte) (string, bool) {
	data = bytes.TrimRight(data, "\x00")
	if len(data) == 0 {
		return "", false
	}
	ascii := true
	for _, c := range data {
		if c < 0x20 || c > 0x7e {
			ascii = false
			break
		}
	}
	s := string(data)
	if !ascii {
		if len(data)%2 == 1 { // the trim took the last character's zero high byte
			data = append(bytes.Clone(data), 0)
		}
		u := make([]uint16, len(data)/2)
		for i := range u {
			u[i] = binary.LittleEndian.Uint16(data[2*i:])
		}
		s = strings.TrimRight(string(utf16.Decode(u)), "\x00")
		for _, r := range s {
			if r < 0x20 || r > 0x7e {
				return "", false
			}
		}
	}
	if len(s) > maxDescription {
		s = s[:maxDescription] + "..."
	}
	return s, s != ""
}
