// Package refusals is how the join service's recent refusals reach the CLI: each join service
// keeps a bounded book of the peers it refused (Book: per peer address, the exact count, the
// last reason and error), and publishes it into one ConfigMap of the cluster (ConfigMapName in
// Namespace), under a key of its own node, with server-side apply (Publisher). The CLI reads
// that object with its admin credentials (Read, Of) to say why a node did not join. Beside its
// book, each join service publishes the names of the reference sets it admits by (key
// <node>.reference-sets, ReadReferenceSets): an upgrade waits for them before it boots a
// release's first node (docs/upgrades.md).
//
// Why a Kubernetes object: the CLI reaches the cluster through the API server only, with the
// admin kubeconfig; the join service already writes its disk records there. The API server
// authenticates both sides (the service account writes, RBAC restricts it to this one object;
// the admin reads), so nothing new listens on the network and no reader outside the cluster's
// administrators learns whom the service refused. docs/joinservice.md, "Refusals the CLI
// reads", has the alternatives.
//
// A refusal says who refused whom: the join service refused the peer, or the peer refused the
// join service (it aborted the attested handshake: a joining node whose check of the service
// failed), with the label the peer gave (RefusedByPeer, PeerReason); and whether trying again
// can change it (Definitive), so that an upgrade stops on a streak of refusals that cannot
// (docs/upgrades.md, "Failure is safe").
//
// Everything in a refusal but the count and the time comes from, or quotes, the peer: readers
// print it as untrusted text (pkg/untrusted).
package refusals

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/openconstellation/constellation/internal/clusterrecord"
	"github.com/openconstellation/constellation/pkg/atls"
	"github.com/openconstellation/constellation/pkg/strictjson"
)

// Where the books are published: one ConfigMap, one key per join service (its node's name).
const (
	Namespace     = clusterrecord.Namespace
	ConfigMapName = "constellation-join-refusals"
)

// Defaults of a Book and a Publisher.
const (
	// MaxPeers bounds a book: the peers refused last are kept. A ConfigMap holds at most 1 MiB
	// for every join service's book; 64 peers with errors of maxError bytes are under 100 KiB.
	MaxPeers = 64
	// maxError bounds a refusal's error text.
	maxError = 1024
	// DefaultInterval is how often a changed book is published.
	DefaultInterval = 2 * time.Second
	// writeTimeout bounds one publication.
	writeTimeout = 10 * time.Second
)

// Refusal is what a join service refused of one peer address.
type Refusal struct {
	// Peer is the refused connection's source address.
	Peer string `json:"peer"`
	// Count is how many admissions of Peer were refused, exactly (the log's limiter does not
	// apply here), since the service started or since the book last dropped the peer.
	Count int `json:"count"`
	// Reason is the last refusal's reason label (docs/joinservice.md, "Observability");
	// atls.ReasonPeerAbort when the peer refused the join service (RefusedByPeer).
	Reason string `json:"reason"`
	// PeerReason is, when the peer refused the join service, the reason label it gave for
	// its abort (atls.Error.PeerReason: one of a closed set, "measurement-mismatch" when the
	// node's check of the service's evidence failed), "" when it gave none (a peer that
	// predates labels, or a join service that does).
	PeerReason string `json:"peerReason,omitempty"`
	// Error is the last refusal's error text, at most 1 KiB: when the peer refused, its own
	// text for why.
	Error string `json:"error"`
	// Streak is how many of Peer's last refusals in a row had this Reason and PeerReason
	// (1 to Count; 0 from a join service that predates it).
	Streak int `json:"streak,omitempty"`
	// Last is when Peer was last refused.
	Last time.Time `json:"last"`
}

// RefusedByPeer reports whether the last refusal was the peer's: it aborted the attested
// handshake, so the joining node refused the join service (its check of the service failed),
// rather than the join service the node.
func (r Refusal) RefusedByPeer() bool { return r.Reason == atls.ReasonPeerAbort }

// Definitive reports whether the last refusal is one that trying again cannot change: one
// side refused the other's evidence for what it measures or who signed it
// (measurement-mismatch, untrusted-signer, bad-signature, wrong-variant, malformed), whichever
// side refused. Everything else may pass on the next attempt and never is: a busy or
// rate-limited service, a timeout or protocol error, a node the platform does not list yet,
// the Kubernetes API, revocation data that could not be fetched, an error no label
// classifies ("other"), and a peer's abort without a label.
func (r Refusal) Definitive() bool {
	label := r.Reason
	if r.RefusedByPeer() {
		label = r.PeerReason
	}
	switch label {
	case "measurement-mismatch", "untrusted-signer", "bad-signature", "wrong-variant", "malformed":
		return true
	}
	return false
}

// sameKind reports whether two refusals are for the same reason, on the same side.
func (r Refusal) sameKind(e Entry) bool { return r.Reason == e.Reason && r.PeerReason == e.PeerReason }

// Entry is one refusal as the join service decided it.
type Entry struct {
	// Reason is the refusal's reason label, atls.ReasonPeerAbort when the peer aborted.
	Reason string
	// PeerReason is the label of the peer's abort (atls.Error.PeerReason).
	PeerReason string
	// Error is the refusal's error text (cut to 1 KiB when added).
	Error string
}

// Book is a join service's refusals, bounded to the MaxPeers peers refused last. It is safe
// for concurrent use.
type Book struct {
	mu      sync.Mutex
	byPeer  map[string]*Refusal
	version uint64 // counts changes, so a publisher writes only a changed book
}

// NewBook returns an empty book.
func NewBook() *Book { return &Book{byPeer: map[string]*Refusal{}} }

// Add records a refusal of peer.
func (b *Book) Add(peer string, e Entry, now time.Time) {
	if len(e.Error) > maxError {
		e.Error = e.Error[:maxError] + "…(cut)"
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	r, ok := b.byPeer[peer]
	if !ok {
		if len(b.byPeer) >= MaxPeers {
			b.dropOldestLocked()
		}
		r = &Refusal{Peer: peer}
		b.byPeer[peer] = r
	}
	if r.Count > 0 && r.sameKind(e) {
		r.Streak++
	} else {
		r.Streak = 1
	}
	r.Count++
	r.Reason, r.PeerReason, r.Error, r.Last = e.Reason, e.PeerReason, e.Error, now
	b.version++
}

func (b *Book) dropOldestLocked() {
	var oldest *Refusal
	for _, r := range b.byPeer {
		if oldest == nil || r.Last.Before(oldest.Last) {
			oldest = r
		}
	}
	if oldest != nil {
		delete(b.byPeer, oldest.Peer)
	}
}

// Snapshot returns the book's refusals, the most recent first, and its version.
func (b *Book) Snapshot() ([]Refusal, uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]Refusal, 0, len(b.byPeer))
	for _, r := range b.byPeer {
		out = append(out, *r)
	}
	slices.SortFunc(out, func(a, b Refusal) int { return b.Last.Compare(a.Last) })
	return out, b.version
}

// Publisher writes a book into the cluster whenever it changed, at most once per Interval.
type Publisher struct {
	Client kubernetes.Interface
	// Node names the key the book is written under: the join service's node.
	Node string
	Book *Book
	// Interval defaults to DefaultInterval.
	Interval time.Duration
	Log      *slog.Logger
	// ReferenceSets, when set, returns the names of the reference sets the service admits
	// nodes by; they are published under the key Node+SetsKeySuffix, so that an upgrade
	// knows when every join service accepts a release's nodes (ReadReferenceSets).
	ReferenceSets func() []string
}

// SetsKeySuffix follows a node's name in the key of its join service's reference-set names.
const SetsKeySuffix = ".reference-sets"

// Run publishes until ctx ends. A failed write is logged and tried again at the next tick:
// the book is diagnostics, and the service admits nodes whether or not it is published.
func (p *Publisher) Run(ctx context.Context) error {
	if p.Client == nil || p.Book == nil || p.Node == "" {
		return errors.New("refusals publisher: client, book and node name are required")
	}
	interval := p.Interval
	if interval <= 0 {
		interval = DefaultInterval
	}
	log := p.Log
	if log == nil {
		log = slog.Default()
	}
	var published uint64
	var publishedSets []string
	first, failing := true, false
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		if !first {
			select {
			case <-ctx.Done():
				return nil
			case <-ticker.C:
			}
		}
		refusals, version := p.Book.Snapshot()
		var sets []string
		if p.ReferenceSets != nil {
			sets = p.ReferenceSets()
		}
		if !first && version == published && slices.Equal(sets, publishedSets) {
			continue
		}
		first = false
		if err := p.publish(ctx, refusals, sets); err != nil {
			if !failing {
				log.Warn("publishing the refusals failed; trying again", "error", err)
			}
			failing = true
			continue
		}
		if failing {
			log.Info("publishing the refusals works again")
		}
		published, publishedSets, failing = version, sets, false
	}
}

// publish writes refusals under the node's key, owning only that key (server-side apply
// with a field manager per node), so the join services of several control planes never
// overwrite each other.
func (p *Publisher) publish(ctx context.Context, refusals []Refusal, sets []string) error {
	data, err := json.Marshal(refusals)
	if err != nil {
		return err
	}
	values := map[string]string{p.Node: string(data)}
	if p.ReferenceSets != nil {
		setsData, err := json.Marshal(sets)
		if err != nil {
			return err
		}
		values[p.Node+SetsKeySuffix] = string(setsData)
	}
	ctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()
	cm := corev1ac.ConfigMap(ConfigMapName, Namespace).WithData(values)
	_, err = p.Client.CoreV1().ConfigMaps(Namespace).Apply(ctx, cm, metav1.ApplyOptions{FieldManager: "joinservice-" + p.Node, Force: true})
	if err != nil {
		return fmt.Errorf("writing %s/%s: %w", Namespace, ConfigMapName, err)
	}
	return nil
}

// Read returns every join service's published refusals, by the join service's node.
func Read(ctx context.Context, client kubernetes.Interface) (map[string][]Refusal, error) {
	cm, err := client.CoreV1().ConfigMaps(Namespace).Get(ctx, ConfigMapName, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading the join service's refusals: %w", err)
	}
	out := map[string][]Refusal{}
	var problems []error
	for node, data := range cm.Data {
		if strings.HasSuffix(node, SetsKeySuffix) {
			continue
		}
		var rs []Refusal
		if err := strictjson.UnmarshalIgnoreUnknown([]byte(data), &rs); err != nil {
			problems = append(problems, fmt.Errorf("the refusals of the join service on %q: %w", node, err))
			continue
		}
		out[node] = rs
	}
	return out, errors.Join(problems...)
}

// Of sums what every join service refused of peer: the count of all refusals, and the
// reason, peer reason and error of the last one (no Streak: a streak is per join service).
// The zero Refusal if none refused it (or none could be read).
func Of(ctx context.Context, client kubernetes.Interface, peer string) Refusal {
	books, _ := Read(ctx, client)
	sum := Refusal{Peer: peer}
	for _, book := range books {
		for _, r := range book {
			if r.Peer != peer {
				continue
			}
			sum.Count += max(r.Count, 0)
			if !r.Last.Before(sum.Last) {
				sum.Reason, sum.PeerReason, sum.Error, sum.Last = r.Reason, r.PeerReason, r.Error, r.Last
			}
		}
	}
	return sum
}

// ReadReferenceSets returns the names of the reference sets each join service published it
// admits nodes by, by the join service's node. A join service that published none is absent.
func ReadReferenceSets(ctx context.Context, client kubernetes.Interface) (map[string][]string, error) {
	cm, err := client.CoreV1().ConfigMaps(Namespace).Get(ctx, ConfigMapName, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading the join services' reference sets: %w", err)
	}
	out := map[string][]string{}
	var problems []error
	for key, data := range cm.Data {
		node, ok := strings.CutSuffix(key, SetsKeySuffix)
		if !ok {
			continue
		}
		var names []string
		if err := strictjson.Unmarshal([]byte(data), &names); err != nil {
			problems = append(problems, fmt.Errorf("the reference sets of the join service on %q: %w", node, err))
			continue
		}
		out[node] = names
	}
	return out, errors.Join(problems...)
}
