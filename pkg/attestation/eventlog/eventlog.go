// Package eventlog replays TCG PC Client (crypto-agile) measurement event logs against quoted
// SHA-256 PCR values, and writes such logs.
//
// An event log is untrusted: it is whatever the node chose to send. It becomes evidence only
// through replay: extending each event's SHA-256 digest, in order, must reproduce the value
// of every PCR the log has events for, and those values must come from a verified quote.
// After a successful replay, an event's digest is as trustworthy as the quote; its data is
// trustworthy only for event types whose digest is defined as the hash of their data, which
// Replay checks for the types listed in dataBoundTypes.
//
// Parsing and replay use github.com/google/go-eventlog (tcg.ParseEventLog, EventLog.Verify,
// extract.PlatformState).
package eventlog

import (
	"bytes"
	"crypto"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/google/go-eventlog/extract"
	pb "github.com/google/go-eventlog/proto/state"
	"github.com/google/go-eventlog/register"
	"github.com/google/go-eventlog/tcg"

	"github.com/openconstellation/constellation/pkg/attestation"
)

// NumPCRs is the number of PCRs an event log may name (PCR 0..23).
const NumPCRs = 24

// Event is one replayed event.
type Event struct {
	// Seq is the event's position in the log (the Spec ID event is 0).
	Seq int
	PCR uint32
	// Type is the event type (tcg.EventType values). It is not covered by the digest: use
	// it only together with the data checks of the type.
	Type tcg.EventType
	// Digest is the SHA-256 digest that was extended into PCR: verified by replay.
	Digest []byte
	// Data is the event data. Bound to Digest only for the types in dataBoundTypes.
	Data []byte
}

// Log is an event log whose events replayed to the quoted PCR values.
type Log struct {
	events []tcg.Event
}

// Events returns the replayed events in log order.
func (l *Log) Events() []Event {
	out := make([]Event, 0, len(l.events))
	for _, e := range l.events {
		out = append(out, Event{Seq: int(e.Num()), PCR: e.MRIndex(), Type: e.Type, Digest: e.Digest, Data: e.Data})
	}
	return out
}

// Platform returns what the firmware's PCR 0 events before the first separator say about the
// platform: the S-CRTM version and, on GCE, the confidential technology of the "GCE
// NonHostInfo" event (GCEConfidentialTechnology_NONE when there is no such event).
func (l *Log) Platform() (*pb.PlatformState, error) {
	st, err := extract.PlatformState(crypto.SHA256, l.events)
	if err != nil {
		return nil, fmt.Errorf("%w: event log platform events: %w", attestation.ErrMalformed, err)
	}
	return st, nil
}

// dataBoundTypes are the event types whose digest the TCG PC Client Platform Firmware
// Profile defines as the hash of the event data, and whose data a verifier may therefore
// read. For every other type the data is an unverified description.
var dataBoundTypes = []tcg.EventType{
	tcg.Separator,
	tcg.EFIAction,
	tcg.SCRTMVersion,
	tcg.NonhostInfo,
}

// Parse decodes a crypto-agile event log without verifying anything. It rejects logs without
// SHA-256 digests (SHA-1-only logs) and events for PCRs outside 0..23. Only Replay's result
// may be trusted; Parse exists for the fuzz target and diagnostics.
func Parse(raw []byte) (*tcg.EventLog, error) {
	if len(raw) == 0 {
		return nil, fmt.Errorf("%w: empty event log", attestation.ErrMalformed)
	}
	el, err := tcg.ParseEventLog(raw, tcg.ParseOpts{})
	if err != nil {
		return nil, fmt.Errorf("%w: event log: %w", attestation.ErrMalformed, err)
	}
	if !slices.Contains(el.Algs, register.HashSHA256) {
		return nil, fmt.Errorf("%w: event log has no SHA-256 digests (algorithms %v)", attestation.ErrMalformed, el.Algs)
	}
	for i, e := range el.Events(register.HashSHA256) {
		if e.Index < 0 || e.Index >= NumPCRs {
			return nil, fmt.Errorf("%w: event log event %d names PCR %d", attestation.ErrMalformed, i, e.Index)
		}
		// go-eventlog panics on types it has no name for once an event replayed; an unknown
		// type is malformed input, never a reason to crash the verifier.
		if _, ok := e.Type.KnownName(); !ok {
			return nil, fmt.Errorf("%w: event log event %d (PCR %d) has unknown type %#x", attestation.ErrMalformed, i, e.Index, uint32(e.Type))
		}
	}
	return el, nil
}

// Replay parses raw and replays it against pcrs (SHA-256 values by index, from a verified
// quote). Every PCR the log has events for must be in pcrs and replay to its value; events
// of data-bound types must carry data that hashes to their digest. Errors wrap
// attestation.ErrMalformed and name the PCR that failed.
func Replay(raw []byte, pcrs map[uint32][]byte) (*Log, error) {
	el, err := Parse(raw)
	if err != nil {
		return nil, err
	}
	mrs := make([]register.MR, 0, len(pcrs))
	for idx, val := range pcrs {
		if idx >= NumPCRs || len(val) != sha256.Size {
			return nil, fmt.Errorf("%w: PCR %d value of %d bytes", attestation.ErrMalformed, idx, len(val))
		}
		mrs = append(mrs, register.PCR{Index: int(idx), Digest: val, DigestAlg: crypto.SHA256})
	}
	for _, e := range el.Events(register.HashSHA256) {
		if _, ok := pcrs[uint32(e.Index)]; !ok {
			return nil, fmt.Errorf("%w: event log has events for PCR %d, which the quote does not cover", attestation.ErrMalformed, e.Index)
		}
		if e.Type != tcg.NoAction && len(e.Digest) == 0 {
			return nil, fmt.Errorf("%w: event log event for PCR %d (%s) has no SHA-256 digest", attestation.ErrMalformed, e.Index, e.Type.TCGString())
		}
	}
	events, err := el.Verify(mrs)
	if err != nil {
		var rErr tcg.ReplayError
		if errors.As(err, &rErr) {
			bad := append([]int(nil), rErr.InvalidMRs...)
			sort.Ints(bad)
			return nil, fmt.Errorf("%w: event log does not replay to the quoted value of %s", attestation.ErrMalformed, pcrNames(bad))
		}
		return nil, fmt.Errorf("%w: event log replay: %w", attestation.ErrMalformed, err)
	}
	for _, e := range events {
		if !slices.Contains(dataBoundTypes, e.Type) {
			continue
		}
		if !dataMatches(e.Type, e.Data, e.Digest) {
			return nil, fmt.Errorf("%w: event log event %d (PCR %d, %s): data does not match its digest", attestation.ErrMalformed, e.Num(), e.Index, e.Type.TCGString())
		}
	}
	return &Log{events: events}, nil
}

// dataMatches reports whether digest is SHA-256 of data. Firmware measures some strings
// with and some without their terminating NUL; both forms are accepted for strings.
func dataMatches(typ tcg.EventType, data, digest []byte) bool {
	sum := sha256.Sum256(data)
	if bytes.Equal(sum[:], digest) {
		return true
	}
	if typ == tcg.SCRTMVersion && len(data) > 0 && data[len(data)-1] == 0 {
		sum = sha256.Sum256(data[:len(data)-1])
		return bytes.Equal(sum[:], digest)
	}
	return false
}

func pcrNames(idx []int) string {
	if len(idx) == 1 {
		return fmt.Sprintf("PCR %d", idx[0])
	}
	return fmt.Sprintf("PCRs %v", idx)
}
