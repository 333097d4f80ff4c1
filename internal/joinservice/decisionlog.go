package joinservice

import (
	"errors"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/openconstellation/constellation/internal/joinservice/refusals"
	"github.com/openconstellation/constellation/pkg/atls"
)

// Defaults of the rejection log limiter (docs/joinservice.md, "Observability").
const (
	// rejectLogInterval: after the first line of a (method, reason, peer), at most one more
	// per interval; the next line carries the count of those suppressed meanwhile.
	rejectLogInterval = 10 * time.Second
	// rejectLogRate and rejectLogBurst cap rejection lines across all keys: a flood from
	// many addresses (every one a new key) writes at most a burst and then one line per
	// second. Counters keep the exact numbers either way.
	rejectLogRate  = rate.Limit(1)
	rejectLogBurst = 100
	// maxLogKeys bounds the limiter's memory.
	maxLogKeys = 4096
	// maxLoggedError bounds the error text of one line: parts of it may come from the peer.
	maxLoggedError = 1024
)

// logKey is what makes two rejections "similar": same stage, same reason, same peer address.
type logKey struct {
	method, reason string
	peer           netip.Addr
}

type logKeyState struct {
	lastLogged time.Time
	suppressed int
}

// logLimiter decides which rejections are written to the log. The first rejection of every
// key is logged (the CLI reads it to tell why a node was refused) unless the global budget is
// spent; after that at most one line per interval per key.
type logLimiter struct {
	interval time.Duration
	now      func() time.Time

	mu     sync.Mutex
	global *rate.Limiter
	keys   map[logKey]*logKeyState
	// dropped counts rejections of keys the limiter could not track (the table was full of
	// keys logged within the interval) and that the global budget suppressed; the next
	// line reports them.
	dropped int
}

func newLogLimiter(interval time.Duration, global rate.Limit, burst int, now func() time.Time) *logLimiter {
	return &logLimiter{interval: interval, now: now, global: rate.NewLimiter(global, burst), keys: map[logKey]*logKeyState{}}
}

// logDecision says whether to write a line, and how many similar rejections (same key) and
// others (untracked keys) were suppressed since the last written one.
type logDecision struct {
	write             bool
	suppressed, other int
}

func (l *logLimiter) allow(k logKey) logDecision {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	st, ok := l.keys[k]
	if !ok && len(l.keys) >= maxLogKeys {
		l.forget(now)
	}
	if !ok && len(l.keys) < maxLogKeys {
		st = &logKeyState{}
		l.keys[k] = st
		ok = true
	}
	if ok && !st.lastLogged.IsZero() && now.Sub(st.lastLogged) < l.interval {
		st.suppressed++
		return logDecision{}
	}
	if !l.global.AllowN(now, 1) {
		if ok {
			st.suppressed++
		} else {
			l.dropped++
		}
		return logDecision{}
	}
	d := logDecision{write: true, other: l.dropped}
	l.dropped = 0
	if ok {
		d.suppressed = st.suppressed
		st.suppressed, st.lastLogged = 0, now
	}
	return d
}

// forget drops the keys whose interval has passed and that have nothing suppressed: their
// next rejection is logged whether or not the limiter remembers them.
func (l *logLimiter) forget(now time.Time) {
	for k, st := range l.keys {
		if now.Sub(st.lastLogged) >= l.interval && st.suppressed == 0 {
			delete(l.keys, k)
		}
	}
	if len(l.keys) < maxLogKeys {
		return
	}
	// Still full: drop keys past their interval even with a suppressed count, which moves
	// to the untracked count so it is still reported.
	for k, st := range l.keys {
		if now.Sub(st.lastLogged) >= l.interval {
			l.dropped += st.suppressed
			delete(l.keys, k)
		}
	}
}

// reject records a refused admission: the rejection counter always, the book of refusals the
// CLI reads (internal/joinservice/refusals) for every stage but volume-key, and a log line
// unless the log limiter suppresses it.
func (s *Service) reject(method string, remote netip.Addr, node, reason string, err error, start time.Time) {
	s.metrics.rejections.WithLabelValues(method, reason).Inc()
	// The book tells why a node did not join (or rejoin). A joined node's refused volume key
	// is no answer to that, and would hide the last join refusal of its address.
	if method != methodVolumeKey {
		s.refusals.Add(remote.String(), bookEntry(reason, err), s.cfg.Now())
	}
	s.metrics.latency.WithLabelValues(method, "rejected").Observe(s.cfg.Now().Sub(start).Seconds())
	d := s.logLimiter.allow(logKey{method: method, reason: reason, peer: remote})
	if !d.write {
		return
	}
	args := []any{"method", method, "peer", remote.String(), "node", node,
		"variant", s.cfg.Validator.Variant().String(), "reason", reason, "error", capError(err.Error())}
	if d.suppressed > 0 {
		args = append(args, "suppressed", d.suppressed)
	}
	if d.other > 0 {
		args = append(args, "suppressedOthers", d.other)
	}
	s.log.Warn("admission rejected", args...)
}

// bookEntry is a refusal as the book keeps it. When the peer aborted the attested handshake
// (it refused this service: a joining node whose check of the service failed), the entry says
// so with the label the peer gave (atls.Error.PeerReason) and keeps the peer's own text, which
// the book's reason already introduces (atls.ReasonPeerAbort), so that the CLI can say which
// side refused and why.
func bookEntry(reason string, err error) refusals.Entry {
	e := refusals.Entry{Reason: reason, Error: err.Error()}
	var ae *atls.Error
	if errors.As(err, &ae) && !ae.Local {
		e.Reason, e.PeerReason, e.Error = atls.ReasonPeerAbort, ae.PeerReason, ae.Err.Error()
	}
	return e
}

// capError cuts an error text to maxLoggedError bytes. Errors quote peer strings through
// untrusted.Quote already; this bounds what slipped through (a library's message).
func capError(msg string) string {
	if len(msg) <= maxLoggedError {
		return msg
	}
	return msg[:maxLoggedError] + "…(cut)"
}
