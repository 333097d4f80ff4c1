// Package nodeauthz is the removed-node authorizer: a webhook every API server of the cluster
// asks, before its Node and RBAC authorizers, about each request of a node identity
// (system:node:<name>). It denies every request of a node that was removed from the cluster
// and has no opinion on anything else, so the Node and RBAC authorizers decide as before.
//
// Why: a removed node keeps the kubelet credential it had (a client certificate cannot be
// revoked before it expires, kubeletcsr.ClientValidity). The admission policy
// internal/deploy applies (RemovedNodesPolicy) refuses every write of a removed identity,
// but admission never sees reads: without this authorizer a removed node could still list
// Services, read its kubeadm configuration and ask who it is until its certificate expired.
// With it, from the moment `apply` writes the removal record (internal/diskowner), such a
// credential can do nothing at all.
//
// Threat model and failure: the authorizer only ever denies. An attacker who stops it (it
// runs in the bootstrapper of every control plane, on loopback) gains nothing but the
// absence of this second layer: the API server then has no opinion from it (failure policy
// NoOpinion, a refused connection is not retried), writes stay refused by the admission
// policy, and the certificate still expires. Failing closed instead would stop every
// kubelet of the cluster whenever one control plane's bootstrapper restarts. Until its view
// of the removal records is synced it has no opinion either (a control plane that just
// booted).
//
// Wiring: the API server reads AuthorizationConfig (authorizers Webhook, Node, RBAC, in this
// order) and WebhookKubeconfig from APIServerConfigDir, which kubeadm mounts into its pod
// (internal/kube/kubeadmconfig); the bootstrapper serves Server on Addr with a serving
// certificate from the cluster CA (internal/provider/local/nodeboot).
package nodeauthz

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	authorizationv1 "k8s.io/api/authorization/v1"

	"github.com/openconstellation/constellation/internal/kube/kubeletcsr"
	"github.com/openconstellation/constellation/pkg/strictjson"
	"github.com/openconstellation/constellation/pkg/untrusted"
)

// Where the API server reaches the authorizer: loopback on every control plane.
const (
	Port = 9002
	Addr = "127.0.0.1:9002"
	// Path is the webhook's URL path.
	Path = "/authorize"
)

// MaxRequestSize bounds a SubjectAccessReview; the API server's are well under 8 KiB.
const MaxRequestSize = 64 << 10

// RemovedSet tells whether a node name was removed from the cluster, and whether it knows
// (synced).
type RemovedSet interface {
	Removed(name string) bool
	Synced() bool
}

// Decision is the authorizer's answer to one request.
type Decision struct {
	// Deny: the request's user is a removed node's identity.
	Deny bool
	// Node is that node's name when Deny.
	Node string
}

// Decide answers for user (the request's user name): deny if it is the identity of a node in
// removed, no opinion otherwise, including when removed is not synced yet.
func Decide(user string, removed RemovedSet) Decision {
	name, ok := strings.CutPrefix(user, kubeletcsr.NodeUserPrefix)
	if !ok || name == "" || !removed.Synced() || !removed.Removed(name) {
		return Decision{}
	}
	return Decision{Deny: true, Node: name}
}

// Handler serves the webhook: it reads a SubjectAccessReview (authorization.k8s.io/v1) and
// answers it with Decide. Every decision is counted; denials are logged, at most once a
// minute per node.
type Handler struct {
	removed RemovedSet
	log     *slog.Logger
	now     func() time.Time
	metrics *metrics

	mu       sync.Mutex
	lastLogs map[string]time.Time // by node name; only removed names, so bounded by them
}

// NewHandler returns the webhook handler over removed. reg (optional) receives the metrics.
func NewHandler(removed RemovedSet, log *slog.Logger, reg prometheus.Registerer, now func() time.Time) (*Handler, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if now == nil {
		now = time.Now
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	return &Handler{removed: removed, log: log, now: now, metrics: m, lastLogs: map[string]time.Time{}}, nil
}

// ErrBadReview is wrapped by every error about a request body.
var ErrBadReview = errors.New("not a SubjectAccessReview of authorization.k8s.io/v1")

// ParseReview parses body as a SubjectAccessReview of authorization.k8s.io/v1 and returns it.
func ParseReview(body []byte) (*authorizationv1.SubjectAccessReview, error) {
	if len(body) > MaxRequestSize {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrBadReview, len(body), MaxRequestSize)
	}
	// Fields Kubernetes may add are ignored; a field twice or in other letter case is
	// refused: the API server reads names exactly, and so must the authorizer it asks.
	var sar authorizationv1.SubjectAccessReview
	if err := strictjson.UnmarshalIgnoreUnknown(body, &sar); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadReview, err)
	}
	if sar.APIVersion != authorizationv1.SchemeGroupVersion.String() || sar.Kind != "SubjectAccessReview" {
		return nil, fmt.Errorf("%w: apiVersion %s, kind %s", ErrBadReview, untrusted.Quote(sar.APIVersion), untrusted.Quote(sar.Kind))
	}
	return &sar, nil
}

// Readiness answers of ReadyPath.
const (
	readyAnswer    = "synced"
	notReadyAnswer = "not synced: the removal records have not been listed yet"
)

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == ReadyPath && (r.Method == http.MethodGet || r.Method == http.MethodHead):
		h.serveReady(w)
	case r.URL.Path == Path && r.Method == http.MethodPost:
		h.serveReview(w, r)
	default:
		http.Error(w, "POST "+Path+" or GET "+ReadyPath+" only", http.StatusNotFound)
	}
}

// serveReady answers whether the authorizer decides: only once its view of the removal
// records is synced. Before, it has no opinion on anything (Decide).
func (h *Handler) serveReady(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if !h.removed.Synced() {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, notReadyAnswer+"\n")
		return
	}
	_, _ = io.WriteString(w, readyAnswer+"\n")
}

func (h *Handler) serveReview(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxRequestSize+1))
	if err != nil {
		http.Error(w, "reading the request", http.StatusBadRequest)
		return
	}
	sar, err := ParseReview(body)
	if err != nil {
		h.metrics.decisions.WithLabelValues("bad-request").Inc()
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	d := Decide(sar.Spec.User, h.removed)
	answer := authorizationv1.SubjectAccessReview{TypeMeta: sar.TypeMeta}
	switch {
	case d.Deny:
		answer.Status = authorizationv1.SubjectAccessReviewStatus{
			Denied: true, Reason: fmt.Sprintf("node %s was removed from the cluster: its credentials are revoked", d.Node),
		}
		h.metrics.decisions.WithLabelValues("denied").Inc()
		h.logDenial(d.Node, sar)
	case !h.removed.Synced():
		h.metrics.decisions.WithLabelValues("not-synced").Inc()
	default:
		h.metrics.decisions.WithLabelValues("no-opinion").Inc()
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(answer)
}

// logDenial logs the first denial of node in a minute.
func (h *Handler) logDenial(node string, sar *authorizationv1.SubjectAccessReview) {
	now := h.now()
	h.mu.Lock()
	last, seen := h.lastLogs[node]
	if seen && now.Sub(last) < time.Minute {
		h.mu.Unlock()
		return
	}
	h.lastLogs[node] = now
	h.mu.Unlock()
	args := []any{"node", node}
	if ra := sar.Spec.ResourceAttributes; ra != nil {
		args = append(args, "verb", untrusted.Quote(ra.Verb), "resource", untrusted.Quote(ra.Resource), "namespace", untrusted.Quote(ra.Namespace))
	} else if na := sar.Spec.NonResourceAttributes; na != nil {
		args = append(args, "verb", untrusted.Quote(na.Verb), "path", untrusted.Quote(na.Path))
	}
	h.log.Info("request of a removed node denied (logged once a minute per node)", args...)
}

type metrics struct {
	decisions *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "constellation", Subsystem: "nodeauthz", Name: "decisions_total",
		Help: "Authorization decisions on node identities: denied (a removed node), no-opinion, not-synced, bad-request.",
	}, []string{"decision"})}
	if reg != nil {
		if err := reg.Register(m.decisions); err != nil {
			return nil, fmt.Errorf("registering the removed-node authorizer's metrics: %w", err)
		}
	}
	return m, nil
}
