package eventlog_test

import (
	"bytes"
	"crypto/sha256"
	"testing"

	"github.com/google/go-eventlog/tcg"
	eltestdata "github.com/google/go-eventlog/testdata"

	"github.com/openconstellation/constellation/pkg/attestation/eventlog"
)

// FuzzReplay feeds arbitrary bytes to the event-log parser and replay, as an attacker
// controls them in evidence: neither may panic, and anything accepted must replay.
func FuzzReplay(f *testing.F) {
	pcrs := map[uint32][]byte{}
	for i := range uint32(eventlog.NumPCRs) {
		pcrs[i] = make([]byte, 32)
	}
	b := eventlog.NewBuilder()
	for _, e := range []struct {
		pcr uint32
		typ tcg.EventType
	}{{0, tcg.SCRTMVersion}, {4, tcg.EFIAction}, {7, tcg.Separator}, {8, tcg.Ipl}} {
		d := b.Add(e.pcr, e.typ, []byte("seed"))
		v := sha256.Sum256(append(bytes.Clone(pcrs[e.pcr]), d[:]...))
		pcrs[e.pcr] = v[:]
	}
	f.Add(b.Bytes())
	f.Add(eltestdata.Ubuntu2404AmdSevSnpEventLog)
	f.Add(eltestdata.Debian10EventLog)
	f.Fuzz(func(t *testing.T, raw []byte) {
		_, _ = eventlog.Parse(raw)
		log, err := eventlog.Replay(raw, pcrs)
		if err != nil {
			return
		}
		_ = log.Events()
		_, _ = log.Platform()
	})
}
