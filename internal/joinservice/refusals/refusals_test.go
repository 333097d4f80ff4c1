package refusals

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func TestBook(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	testCases := map[string]struct {
		add  func(b *Book)
		want []Refusal
	}{
		"empty": {add: func(*Book) {}, want: []Refusal{}},
		"counts every refusal of a peer, keeps the last reason": {
			add: func(b *Book) {
				b.Add("10.0.0.1", Entry{Reason: "rate-limited", Error: "too many"}, t0)
				b.Add("10.0.0.1", Entry{Reason: "attestation", Error: "PCR 11"}, t0.Add(time.Second))
			},
			want: []Refusal{{Peer: "10.0.0.1", Count: 2, Reason: "attestation", Error: "PCR 11", Streak: 1, Last: t0.Add(time.Second)}},
		},
		"most recent first": {
			add: func(b *Book) {
				b.Add("10.0.0.1", Entry{Reason: "a", Error: "e"}, t0)
				b.Add("10.0.0.2", Entry{Reason: "b", Error: "e"}, t0.Add(time.Second))
			},
			want: []Refusal{{Peer: "10.0.0.2", Count: 1, Reason: "b", Error: "e", Streak: 1, Last: t0.Add(time.Second)}, {Peer: "10.0.0.1", Count: 1, Reason: "a", Error: "e", Streak: 1, Last: t0}},
		},
		"a long error is cut": {
			add:  func(b *Book) { b.Add("10.0.0.1", Entry{Reason: "a", Error: strings.Repeat("x", 2*maxError)}, t0) },
			want: []Refusal{{Peer: "10.0.0.1", Count: 1, Reason: "a", Error: strings.Repeat("x", maxError) + "…(cut)", Streak: 1, Last: t0}},
		},
		// The streak counts the refusals in a row with the same reason and peer reason: the
		// CLI stops an upgrade on a streak of definitive ones (docs/upgrades.md).
		"a streak of the same refusal": {
			add: func(b *Book) {
				b.Add("10.0.0.1", Entry{Reason: "busy", Error: "e"}, t0)
				for i := range 3 {
					b.Add("10.0.0.1", Entry{Reason: "peer-abort", PeerReason: "measurement-mismatch", Error: "m"}, t0.Add(time.Duration(i+1)*time.Second))
				}
			},
			want: []Refusal{{Peer: "10.0.0.1", Count: 4, Reason: "peer-abort", PeerReason: "measurement-mismatch", Error: "m", Streak: 3, Last: t0.Add(3 * time.Second)}},
		},
		"another peer reason breaks the streak": {
			add: func(b *Book) {
				b.Add("10.0.0.1", Entry{Reason: "peer-abort", PeerReason: "measurement-mismatch", Error: "m"}, t0)
				b.Add("10.0.0.1", Entry{Reason: "peer-abort", PeerReason: "protocol", Error: "timeout"}, t0.Add(time.Second))
				b.Add("10.0.0.1", Entry{Reason: "peer-abort", PeerReason: "measurement-mismatch", Error: "m"}, t0.Add(2*time.Second))
			},
			want: []Refusal{{Peer: "10.0.0.1", Count: 3, Reason: "peer-abort", PeerReason: "measurement-mismatch", Error: "m", Streak: 1, Last: t0.Add(2 * time.Second)}},
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			b := NewBook()
			tc.add(b)
			got, _ := b.Snapshot()
			assert.Equal(t, tc.want, got)
		})
	}
}

// TestBookBounded: a flood from many addresses keeps the book at MaxPeers, the peers refused
// last.
func TestBookBounded(t *testing.T) {
	b := NewBook()
	t0 := time.Now()
	for i := range 10 * MaxPeers {
		b.Add(fmt.Sprintf("10.1.%d.%d", i/256, i%256), Entry{Reason: "busy", Error: "e"}, t0.Add(time.Duration(i)*time.Millisecond))
	}
	got, version := b.Snapshot()
	require.Len(t, got, MaxPeers)
	assert.Equal(t, uint64(10*MaxPeers), version, "every refusal changes the book")
	last := 10*MaxPeers - 1
	assert.Equal(t, fmt.Sprintf("10.1.%d.%d", last/256, last%256), got[0].Peer)
}

func TestOf(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: ConfigMapName, Namespace: Namespace},
		Data: map[string]string{
			"control-plane-0": `[{"peer":"10.42.0.12","count":2,"reason":"attestation","error":"old","last":"2026-01-01T00:00:00Z"}]`,
			"control-plane-1": `[{"peer":"10.42.0.12","count":1,"reason":"peer-abort","peerReason":"measurement-mismatch","streak":1,"error":"new","last":"2026-01-01T00:00:05Z"},{"peer":"10.42.0.13","count":7,"reason":"busy","error":"x","last":"2026-01-01T00:00:01Z"}]`,
			"control-plane-2": `not json`,
		},
	}
	client := fake.NewClientset(cm)
	assert.Equal(t, Refusal{Peer: "10.42.0.12", Count: 3, Reason: "peer-abort", PeerReason: "measurement-mismatch", Error: "new", Last: t0.Add(5 * time.Second)}, Of(t.Context(), client, "10.42.0.12"),
		"summed over the join services, the last refusal's reason")
	assert.Equal(t, Refusal{Peer: "10.42.0.99"}, Of(t.Context(), client, "10.42.0.99"))
	_, err := Read(t.Context(), client)
	assert.ErrorContains(t, err, `"control-plane-2"`, "a book that does not parse is named")

	assert.Equal(t, Refusal{Peer: "10.42.0.12"}, Of(t.Context(), fake.NewClientset(), "10.42.0.12"), "nothing published yet")
}

// The publisher writes the names of the sets in force at once and again when they change,
// beside the book; readers of the book skip them.
func TestPublishReferenceSets(t *testing.T) {
	client := fake.NewClientset()
	var mu sync.Mutex
	sets := []string{"v0.1.0"}
	p := &Publisher{Client: client, Node: "control-plane-0", Book: NewBook(), Interval: 10 * time.Millisecond,
		ReferenceSets: func() []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(sets) }}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	published := func() []string {
		got, err := ReadReferenceSets(t.Context(), client)
		if err != nil {
			return nil
		}
		return got["control-plane-0"]
	}
	require.EventuallyWithT(t, func(c *assert.CollectT) { assert.Equal(c, []string{"v0.1.0"}, published()) }, 10*time.Second, 10*time.Millisecond)
	mu.Lock()
	sets = []string{"v0.1.0", "v0.2.0"}
	mu.Unlock()
	require.EventuallyWithT(t, func(c *assert.CollectT) { assert.Equal(c, []string{"v0.1.0", "v0.2.0"}, published()) }, 10*time.Second, 10*time.Millisecond)

	books, err := Read(t.Context(), client)
	require.NoError(t, err, "the sets' key is not a book")
	assert.Equal(t, map[string][]Refusal{"control-plane-0": {}}, books)
}

// Who refused whom, and whether trying again can change it, from the record's labels.
func TestRefusalKinds(t *testing.T) {
	for name, tc := range map[string]struct {
		r                  Refusal
		byPeer, definitive bool
	}{
		"the service refused the node's measurements":    {r: Refusal{Reason: "measurement-mismatch"}, definitive: true},
		"the service refused the node's signer":          {r: Refusal{Reason: "untrusted-signer"}, definitive: true},
		"the node refused the service's measurements":    {r: Refusal{Reason: "peer-abort", PeerReason: "measurement-mismatch"}, byPeer: true, definitive: true},
		"the node refused the service's AK":              {r: Refusal{Reason: "peer-abort", PeerReason: "untrusted-signer"}, byPeer: true, definitive: true},
		"the node aborted on a timeout":                  {r: Refusal{Reason: "peer-abort", PeerReason: "protocol"}, byPeer: true},
		"the node gave no label (an older node)":         {r: Refusal{Reason: "peer-abort"}, byPeer: true},
		"busy":                                           {r: Refusal{Reason: "busy"}},
		"rate-limited":                                   {r: Refusal{Reason: "rate-limited"}},
		"the platform does not list it yet":              {r: Refusal{Reason: "unknown-node"}},
		"the Kubernetes API":                             {r: Refusal{Reason: "kubernetes-api"}},
		"a handshake timeout":                            {r: Refusal{Reason: "timeout"}},
		"revocation unknown":                             {r: Refusal{Reason: "revocation-unknown"}},
		"an unclassified validation error":               {r: Refusal{Reason: "other"}},
		"a peer reason on a service refusal is not read": {r: Refusal{Reason: "busy", PeerReason: "measurement-mismatch"}},
	} {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.byPeer, tc.r.RefusedByPeer())
			assert.Equal(t, tc.definitive, tc.r.Definitive())
		})
	}
}
