package cli

import (
	"context"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/openconstellation/constellation/internal/joinservice/refusals"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/state"
	"github.com/openconstellation/constellation/pkg/untrusted"
)

const replacementIP = "10.42.0.12"

// nodeRefused is a join service's record of a replacement that refused it (its check of the
// service's evidence failed), count times, the last streak of them in a row.
func nodeRefused(label string, count, streak int, last time.Time) refusals.Refusal {
	return refusals.Refusal{Peer: replacementIP, Count: count, Streak: streak, Reason: "peer-abort", PeerReason: label,
		Error: "measurements do not match any reference set: closest is \"this node's image\"", Last: last}
}

// serviceRefused is a join service's record of a replacement it refused.
func serviceRefused(reason string, count, streak int, last time.Time) refusals.Refusal {
	return refusals.Refusal{Peer: replacementIP, Count: count, Streak: streak, Reason: reason, Error: "PCR 11: expected ab", Last: last}
}

// TestRefusalsSince decides when a replacement's refusals stop the upgrade: definitiveStreak
// refusals in a row since it was created, each definitive, of one kind on every join service
// that refused it since; nothing transient ever counts.
func TestRefusalsSince(t *testing.T) {
	created := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	after := created.Add(30 * time.Second)
	before := created.Add(-time.Minute)
	for name, tc := range map[string]struct {
		baseline       map[string][]refusals.Refusal
		books          map[string][]refusals.Refusal
		wantDefinitive bool
		wantCount      int
		wantStreak     int
	}{
		"the new node refused the join service 3 times in a row": {
			books:          map[string][]refusals.Refusal{"control-plane-0": {nodeRefused("measurement-mismatch", 3, 3, after)}},
			wantDefinitive: true, wantCount: 3, wantStreak: 3,
		},
		"twice is not yet": {
			books:     map[string][]refusals.Refusal{"control-plane-0": {nodeRefused("measurement-mismatch", 2, 2, after)}},
			wantCount: 2, wantStreak: 2,
		},
		"the join service refused the node's measurements 3 times in a row": {
			books:          map[string][]refusals.Refusal{"control-plane-0": {serviceRefused("measurement-mismatch", 4, 3, after)}},
			wantDefinitive: true, wantCount: 4, wantStreak: 3,
		},
		"the node's signer, 3 times": {
			books:          map[string][]refusals.Refusal{"control-plane-0": {serviceRefused("untrusted-signer", 3, 3, after)}},
			wantDefinitive: true, wantCount: 3, wantStreak: 3,
		},
		"a busy join service never stops it": {
			books:     map[string][]refusals.Refusal{"control-plane-0": {serviceRefused("busy", 27, 27, after)}},
			wantCount: 27, wantStreak: 27,
		},
		"rate-limited never stops it": {
			books:     map[string][]refusals.Refusal{"control-plane-0": {serviceRefused("rate-limited", 27, 27, after)}},
			wantCount: 27, wantStreak: 27,
		},
		"a node the platform does not list yet never stops it": {
			books:     map[string][]refusals.Refusal{"control-plane-0": {serviceRefused("unknown-node", 27, 27, after)}},
			wantCount: 27, wantStreak: 27,
		},
		"the node's timeouts never stop it": {
			books:     map[string][]refusals.Refusal{"control-plane-0": {nodeRefused("protocol", 27, 27, after)}},
			wantCount: 27, wantStreak: 27,
		},
		"a node that gives no label never stops it": {
			books:     map[string][]refusals.Refusal{"control-plane-0": {nodeRefused("", 27, 27, after)}},
			wantCount: 27, wantStreak: 27,
		},
		"an unclassified validation error never stops it": {
			books:     map[string][]refusals.Refusal{"control-plane-0": {serviceRefused("other", 27, 27, after)}},
			wantCount: 27, wantStreak: 27,
		},
		"a join service without streaks never stops it": {
			books:     map[string][]refusals.Refusal{"control-plane-0": {nodeRefused("measurement-mismatch", 27, 0, after)}},
			wantCount: 27,
		},
		"refusals of the address before the replacement do not count": {
			baseline:  map[string][]refusals.Refusal{"control-plane-0": {nodeRefused("measurement-mismatch", 27, 27, before)}},
			books:     map[string][]refusals.Refusal{"control-plane-0": {nodeRefused("measurement-mismatch", 29, 29, after)}},
			wantCount: 2, wantStreak: 2,
		},
		"three since the baseline do": {
			baseline:       map[string][]refusals.Refusal{"control-plane-0": {nodeRefused("measurement-mismatch", 27, 27, before)}},
			books:          map[string][]refusals.Refusal{"control-plane-0": {nodeRefused("measurement-mismatch", 30, 30, after)}},
			wantDefinitive: true, wantCount: 3, wantStreak: 3,
		},
		"a record dropped from the book and added again counts from its start": {
			baseline:       map[string][]refusals.Refusal{"control-plane-0": {nodeRefused("measurement-mismatch", 27, 27, before)}},
			books:          map[string][]refusals.Refusal{"control-plane-0": {nodeRefused("measurement-mismatch", 3, 3, after)}},
			wantDefinitive: true, wantCount: 3, wantStreak: 3,
		},
		"without a baseline, a record last written before the replacement is someone else's": {
			books: map[string][]refusals.Refusal{"control-plane-0": {nodeRefused("measurement-mismatch", 27, 27, before)}},
		},
		"with a baseline, the join services' clocks do not matter": {
			baseline:       map[string][]refusals.Refusal{},
			books:          map[string][]refusals.Refusal{"control-plane-0": {nodeRefused("measurement-mismatch", 3, 3, before)}},
			wantDefinitive: true, wantCount: 3, wantStreak: 3,
		},
		"in a row over two join services": {
			books: map[string][]refusals.Refusal{
				"control-plane-0": {nodeRefused("measurement-mismatch", 2, 2, after)},
				"control-plane-1": {nodeRefused("measurement-mismatch", 1, 1, after.Add(time.Second))},
			},
			wantDefinitive: true, wantCount: 3, wantStreak: 3,
		},
		"a join service whose last refusal is transient holds it": {
			books: map[string][]refusals.Refusal{
				"control-plane-0": {nodeRefused("measurement-mismatch", 5, 5, after)},
				"control-plane-1": {serviceRefused("busy", 1, 1, after.Add(time.Second))},
			},
			wantCount: 6, wantStreak: 1,
		},
		"two kinds are not one reason in a row": {
			books: map[string][]refusals.Refusal{
				"control-plane-0": {nodeRefused("measurement-mismatch", 2, 2, after)},
				"control-plane-1": {serviceRefused("measurement-mismatch", 2, 2, after.Add(time.Second))},
			},
			wantCount: 4, wantStreak: 2,
		},
		"other addresses are not the replacement": {
			books: map[string][]refusals.Refusal{"control-plane-0": {{Peer: "10.42.0.13", Count: 9, Streak: 9, Reason: "measurement-mismatch", Last: after}}},
		},
	} {
		t.Run(name, func(t *testing.T) {
			got, definitive := newRefusalBaseline(tc.baseline).since(tc.books, replacementIP, created)
			assert.Equal(t, tc.wantDefinitive, definitive)
			assert.Equal(t, tc.wantCount, got.Count, "refusals since the replacement was created")
			assert.Equal(t, tc.wantStreak, got.Streak, "in a row, of the last one's kind")
		})
	}
}

// TestRejectionsSayWhoRefusedWhom: apply names the side that refused. A join service that
// recorded a peer abort was refused BY the node (its check of the service failed); only
// otherwise did the join service reject the node.
func TestRejectionsSayWhoRefusedWhom(t *testing.T) {
	now := time.Now()
	for name, tc := range map[string]struct {
		r           refusals.Refusal
		want        []string
		wantMissing []string
	}{
		"the node refused the join service's measurements": {
			r:           nodeRefused("measurement-mismatch", 27, 27, now),
			want:        []string{"it refused the join service 27 time(s): its check of the join service's attestation failed (measurement-mismatch), last: measurements do not match"},
			wantMissing: []string{"the join service rejected it", "peer aborted"},
		},
		"the node aborted for another reason": {
			r:    nodeRefused("protocol", 2, 2, now),
			want: []string{"it refused the join service 2 time(s): it aborted the attested handshake (protocol), last: "},
		},
		"a node without labels": {
			r:    nodeRefused("", 2, 2, now),
			want: []string{"it refused the join service 2 time(s): it aborted the attested handshake without a reason label, last: "},
		},
		"the join service refused the node": {
			r:    serviceRefused("measurement-mismatch", 3, 3, now),
			want: []string{"the join service rejected it 3 time(s), last: measurement-mismatch: PCR 11: expected ab"},
		},
		"no record": {
			want: []string{"the join service has no record of it"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			got := rejections{tc.r}.String()
			for _, w := range tc.want {
				assert.Contains(t, got, w)
			}
			for _, w := range tc.wantMissing {
				assert.NotContains(t, got, w)
			}
		})
	}
}

// TestStopMessages: the error that stops a replacement names who refused whom, and for a node
// that does not trust the running join services' measurements, what to do about it.
func TestStopMessages(t *testing.T) {
	err := refusedForGood("control-plane-1", replacementIP, nodeRefused("measurement-mismatch", 3, 3, time.Now()))
	assert.ErrorContains(t, err, "the new node control-plane-1 (10.42.0.12) refused the join service 3 time(s) in a row: its check of the join service's attestation failed (measurement-mismatch)")
	assert.ErrorContains(t, err, "--from")
	err = refusedForGood("control-plane-1", replacementIP, serviceRefused("measurement-mismatch", 3, 3, time.Now()))
	assert.ErrorContains(t, err, "the join service refused control-plane-1 (10.42.0.12) 3 time(s) in a row on attestation: measurement-mismatch: PCR 11: expected ab")
	assert.NotContains(t, err.Error(), "--from")

	// Hostile fields of a record (a ConfigMap anyone with write access to kube-system could
	// edit, texts that quote the peer) are printed escaped and bounded.
	hostileText := "\x1b[2J\x1b]0;pwned\x07\r\nlevel=ERROR msg=forged" + strings.Repeat("\x1b[31m", 50<<10)
	r := refusals.Refusal{Peer: replacementIP, Count: 3, Streak: 3, Reason: "peer-abort", PeerReason: "measurement-mismatch", Error: hostileText}
	for _, msg := range []string{refusedForGood("control-plane-1", replacementIP, r).Error(), rejections{r}.String(),
		rejections{refusals.Refusal{Count: 1, Reason: "peer-abort", PeerReason: hostileText, Error: hostileText}}.String()} {
		for _, c := range []string{"\x1b", "\x07", "\r", "\n"} {
			assert.NotContains(t, msg, c)
		}
		assert.LessOrEqual(t, len(msg), 2*(untrusted.MaxTextBytes+32)+512)
	}
}

// TestWaitReplacementStops runs the wait apply runs for each replacement, on a fake cluster
// whose join services published their refusals: a replacement refused for good stops it at
// once (within a poll, not at its 10-minute bound), with the words of who refused whom; one
// refused only transiently is waited for.
func TestWaitReplacementStops(t *testing.T) {
	created := time.Now()
	for name, tc := range map[string]struct {
		baseline, books map[string][]refusals.Refusal
		wantStop        string
	}{
		"the new node refuses every join service of the cluster": {
			books:    map[string][]refusals.Refusal{"control-plane-0": {nodeRefused("measurement-mismatch", 3, 3, created.Add(time.Second))}},
			wantStop: "the new node control-plane-1 (10.42.0.12) refused the join service 3 time(s) in a row: its check of the join service's attestation failed (measurement-mismatch)",
		},
		"the join services refuse the new node": {
			books:    map[string][]refusals.Refusal{"control-plane-0": {serviceRefused("measurement-mismatch", 3, 3, created.Add(time.Second))}},
			wantStop: "the join service refused control-plane-1 (10.42.0.12) 3 time(s) in a row on attestation: measurement-mismatch",
		},
		"an earlier replacement's refusals at the same address": {
			baseline: map[string][]refusals.Refusal{"control-plane-0": {nodeRefused("measurement-mismatch", 27, 27, created.Add(-time.Hour))}},
			books:    map[string][]refusals.Refusal{"control-plane-0": {nodeRefused("measurement-mismatch", 28, 28, created.Add(time.Second))}},
		},
		"a busy join service": {
			books: map[string][]refusals.Refusal{"control-plane-0": {serviceRefused("busy", 9, 9, created.Add(time.Second))}},
		},
	} {
		t.Run(name, func(t *testing.T) {
			data := map[string]string{}
			for node, book := range tc.books {
				b, err := json.Marshal(book)
				require.NoError(t, err)
				data[node] = string(b)
			}
			client := fake.NewClientset(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: refusals.ConfigMapName, Namespace: refusals.Namespace}, Data: data})
			out := &lockedBuffer{}
			tm := newPhaseTimer(out)
			u := &upgrade{reconciler: &reconciler{out: out, t: tm, prog: newProgress(tm), client: client,
				st: &state.State{Nodes: []state.Node{{Name: "control-plane-1", Role: metadata.ControlPlane, IPs: []netip.Addr{netip.MustParseAddr(replacementIP)}}}}}}
			bound := 4 * time.Second
			ctx, cancel := context.WithTimeout(t.Context(), bound)
			defer cancel()
			start := time.Now()
			err := u.waitReplacement(ctx, "control-plane-1", newRefusalBaseline(tc.baseline), created)
			require.Error(t, err)
			if tc.wantStop == "" {
				assert.ErrorIs(t, err, context.DeadlineExceeded, "waited until the bound: %v", err)
				return
			}
			assert.NotErrorIs(t, err, context.DeadlineExceeded)
			assert.ErrorContains(t, err, tc.wantStop)
			assert.Less(t, time.Since(start), bound-time.Second, "stopped at once, not at the bound")
		})
	}
}
