package cli

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/openconstellation/constellation/internal/joinservice/refusals"
	"github.com/openconstellation/constellation/pkg/untrusted"
)

// What apply makes of the join services' published refusals of a node
// (internal/joinservice/refusals): who refused whom, in words, and when an upgrade's
// replacement is refused for good (docs/upgrades.md, "Failure is safe").

// definitiveStreak is how many refusals of a replacement in a row, each definitive
// (refusals.Refusal.Definitive: one side refused the other's evidence for what it measures or
// who signed it) and all of one kind, stop the upgrade before its bound. One could be a race
// (a join service that had not reloaded its sets when the node first asked); three are not:
// the node's join client backs off 1 s, then 2 s, so three come within seconds, where the
// bound is 10 minutes. Transient refusals never count (refusals.Refusal.Definitive).
const definitiveStreak = 3

// refusalBaseline is what the join services had published of each address before a
// replacement was created: per join service (its node), per peer address, the count. A
// replacement may get the address of a node refused before (an earlier attempt of the same
// release): only refusals since the baseline are the replacement's.
type refusalBaseline struct {
	counts map[string]map[string]int
	// read says whether the books could be read. Without a baseline, only records written
	// after the replacement was created count: the join services' clocks against the CLI's,
	// which is why the counts are preferred.
	read bool
}

// newRefusalBaseline takes the baseline from the join services' books (refusals.Read); nil
// books (they could not be read) make none.
func newRefusalBaseline(books map[string][]refusals.Refusal) refusalBaseline {
	b := refusalBaseline{counts: map[string]map[string]int{}, read: books != nil}
	for service, book := range books {
		b.counts[service] = map[string]int{}
		for _, r := range book {
			b.counts[service][r.Peer] = r.Count
		}
	}
	return b
}

// since sums what the join services refused of ip since the baseline (without one, in records
// last written after created): Count is the number of refusals since; Reason, PeerReason,
// Error and Last are the last refusal's; Streak is how many refusals in a row were of the last
// one's kind, summed over the join services whose last refusal of ip is of that kind, each
// counted only since the baseline. They are definitive when every join service that refused
// ip since has a definitive last refusal of that one kind, and Streak reaches
// definitiveStreak. A join service that publishes no streaks (one older than them) counts
// none, so its refusals never stop a replacement before its bound.
func (b refusalBaseline) since(books map[string][]refusals.Refusal, ip string, created time.Time) (refusals.Refusal, bool) {
	sum := refusals.Refusal{Peer: ip}
	type counted struct {
		r          refusals.Refusal
		since, run int
	}
	var lasts []counted
	for service, book := range books {
		for _, r := range book {
			if r.Peer != ip || (!b.read && !r.Last.After(created)) {
				continue
			}
			since := r.Count - b.counts[service][ip]
			if since < 0 { // the book dropped the address and added it again
				since = r.Count
			}
			if since <= 0 {
				continue
			}
			lasts = append(lasts, counted{r: r, since: since, run: min(max(r.Streak, 0), since)})
		}
	}
	if len(lasts) == 0 {
		return sum, false
	}
	last := slices.MaxFunc(lasts, func(a, b counted) int { return a.r.Last.Compare(b.r.Last) }).r
	sum.Reason, sum.PeerReason, sum.Error, sum.Last = last.Reason, last.PeerReason, last.Error, last.Last
	oneKind := true
	for _, c := range lasts {
		sum.Count += c.since
		if c.r.Reason == last.Reason && c.r.PeerReason == last.PeerReason {
			sum.Streak += c.run
		} else {
			oneKind = false
		}
	}
	return sum, oneKind && last.Definitive() && sum.Streak >= definitiveStreak
}

// rejections is what the join services refused of one node address (refusals.Of), for
// printing after the node's name and address.
type rejections struct{ refusals.Refusal }

// String says who refused whom. A peer abort the join service recorded means the NODE refused
// the join service (its check of the service failed); only otherwise did the join service
// reject the node. Everything but the count quotes the peer or was read back from the
// cluster: printed escaped and bounded, one line each (untrusted.Text).
func (r rejections) String() string {
	switch {
	case r.Count == 0:
		return "the join service has no record of it (it did not reach the join service, or is still booting)"
	case r.RefusedByPeer():
		return fmt.Sprintf("it refused the join service %d time(s): %s", r.Count, peerRefusal(r.Refusal))
	}
	return fmt.Sprintf("the join service rejected it %d time(s), last: %s: %s", r.Count, untrusted.Text(r.Reason), untrusted.Text(r.Error))
}

// peerRefusal says why a node refused the join service, from the label it gave for its abort
// (refusals.Refusal.PeerReason) and its text.
func peerRefusal(r refusals.Refusal) string {
	why := "it aborted the attested handshake without a reason label"
	switch {
	case r.Definitive():
		why = fmt.Sprintf("its check of the join service's attestation failed (%s)", untrusted.Text(r.PeerReason))
	case r.PeerReason != "":
		why = fmt.Sprintf("it aborted the attested handshake (%s)", untrusted.Text(r.PeerReason))
	}
	return why + ", last: " + untrusted.Text(r.Error)
}

// refusedForGood is the error that stops an upgrade at its replacement node (at ip), whose
// refusals r are definitive.
func refusedForGood(node, ip string, r refusals.Refusal) error {
	if !r.RefusedByPeer() {
		return fmt.Errorf("the join service refused %s (%s) %d time(s) in a row on attestation: %s: %s",
			node, ip, r.Streak, untrusted.Text(r.Reason), untrusted.Text(r.Error))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "the new node %s (%s) refused the join service %d time(s) in a row: %s", node, ip, r.Streak, peerRefusal(r))
	if r.PeerReason == "measurement-mismatch" {
		b.WriteString(" (a node accepts only join services of its own image and of the releases its release was made from: " +
			"make the release with --from <the running release> (make release VERSION=... FROM=...), docs/upgrades.md)")
	}
	return errors.New(b.String())
}
