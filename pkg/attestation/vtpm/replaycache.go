package vtpm

import (
	"crypto/sha256"
	"encoding/binary"

	"github.com/openconstellation/constellation/pkg/attestation/eventlog"
	"github.com/openconstellation/constellation/pkg/attestation/internal/memo"
)

// replayCache remembers event logs that replayed to a set of PCR values. A node sends the
// same firmware log and PCRs with every evidence until it reboots, and replaying a cloud's
// firmware log costs ~160 µs (more than verifying the quote), so the replay runs once per
// (log, PCRs) instead of once per evidence. Keyed by SHA-256 over the log and the values of
// all PCRs, so any change is a miss; only successful replays are stored. Bounded: when full
// it is cleared, which costs only re-replaying.
type replayCache struct {
	memo *memo.Memo[[32]byte, *eventlog.Log]
}

func newReplayCache(max int) *replayCache {
	return &replayCache{memo: memo.New[[32]byte, *eventlog.Log](max)}
}

// replay returns eventlog.Replay(raw, pcrs), from the cache when this log replayed to these
// PCRs before.
func (c *replayCache) replay(raw []byte, pcrs map[uint32][]byte) (*eventlog.Log, error) {
	h := sha256.New()
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(raw)))
	h.Write(n[:])
	h.Write(raw)
	for i := range uint32(NumPCRs) {
		h.Write(pcrs[i])
	}
	var key [32]byte
	h.Sum(key[:0])

	if log, ok := c.memo.Get(key); ok {
		return log, nil
	}
	log, err := eventlog.Replay(raw, pcrs)
	if err != nil {
		return nil, err
	}
	c.memo.Put(key, log)
	return log, nil
}
