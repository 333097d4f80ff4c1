package nodeauthz_test

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/openconstellation/constellation/internal/nodeauthz"
)

// set is a fixed RemovedSet.
type set struct {
	names  map[string]bool
	synced bool
}

func (s set) Removed(name string) bool { return s.names[name] }
func (s set) Synced() bool             { return s.synced }

func TestDecide(t *testing.T) {
	removed := set{names: map[string]bool{"worker-1": true}, synced: true}
	testCases := map[string]struct {
		user    string
		removed nodeauthz.RemovedSet
		want    nodeauthz.Decision
	}{
		"removed node":                  {user: "system:node:worker-1", removed: removed, want: nodeauthz.Decision{Deny: true, Node: "worker-1"}},
		"another node":                  {user: "system:node:worker-0", removed: removed},
		"a name that only starts alike": {user: "system:node:worker-10", removed: removed},
		"an admin named like the node":  {user: "worker-1", removed: removed},
		"a service account":             {user: "system:serviceaccount:kube-system:worker-1", removed: removed},
		"empty node name":               {user: "system:node:", removed: removed},
		"not synced yet":                {user: "system:node:worker-1", removed: set{names: removed.names}},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, nodeauthz.Decide(tc.user, tc.removed))
		})
	}
}

func review(user string) []byte {
	data, _ := json.Marshal(authorizationv1.SubjectAccessReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "authorization.k8s.io/v1", Kind: "SubjectAccessReview"},
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: []string{"system:nodes"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "list", Resource: "services"},
		},
	})
	return data
}

func TestHandler(t *testing.T) {
	reg := prometheus.NewRegistry()
	var logs bytes.Buffer
	now := time.Unix(1000, 0)
	h, err := nodeauthz.NewHandler(set{names: map[string]bool{"worker-1": true}, synced: true}, slogTo(&logs), reg, func() time.Time { return now })
	require.NoError(t, err)
	post := func(path string, body []byte) (*httptest.ResponseRecorder, authorizationv1.SubjectAccessReview) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body)))
		var out authorizationv1.SubjectAccessReview
		if rec.Code == http.StatusOK {
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &out))
		}
		return rec, out
	}

	rec, out := post(nodeauthz.Path, review("system:node:worker-1"))
	require.Equal(t, http.StatusOK, rec.Code)
	assert.True(t, out.Status.Denied)
	assert.False(t, out.Status.Allowed, "the authorizer never allows")
	assert.Contains(t, out.Status.Reason, "node worker-1 was removed from the cluster")
	assert.Equal(t, "authorization.k8s.io/v1", out.APIVersion)

	rec, out = post(nodeauthz.Path, review("system:node:worker-0"))
	require.Equal(t, http.StatusOK, rec.Code)
	assert.False(t, out.Status.Denied)
	assert.False(t, out.Status.Allowed, "no opinion: neither allowed nor denied")

	// A removed node hammering: one log line a minute.
	for range 5 {
		post(nodeauthz.Path, review("system:node:worker-1"))
	}
	assert.Equal(t, 1, strings.Count(logs.String(), "request of a removed node denied"))
	now = now.Add(time.Minute)
	post(nodeauthz.Path, review("system:node:worker-1"))
	assert.Equal(t, 2, strings.Count(logs.String(), "request of a removed node denied"))

	// Garbage is refused, named, bounded.
	for name, tc := range map[string]struct {
		path string
		body []byte
		code int
		want string
	}{
		"wrong path":    {path: "/", body: review("x"), code: http.StatusNotFound},
		"not JSON":      {path: nodeauthz.Path, body: []byte("\x1b[2J"), code: http.StatusBadRequest, want: "not a SubjectAccessReview"},
		"wrong kind":    {path: nodeauthz.Path, body: []byte(`{"apiVersion":"authorization.k8s.io/v1","kind":"TokenReview\u001b"}`), code: http.StatusBadRequest, want: `kind "TokenReview\x1b"`},
		"wrong version": {path: nodeauthz.Path, body: []byte(`{"apiVersion":"authorization.k8s.io/v1beta1","kind":"SubjectAccessReview"}`), code: http.StatusBadRequest, want: "v1beta1"},
		"oversized":     {path: nodeauthz.Path, body: append(review("system:node:worker-1"), bytes.Repeat([]byte(" "), nodeauthz.MaxRequestSize)...), code: http.StatusBadRequest, want: "limit"},
		// One reading only: the API server reads names exactly, so must its authorizer.
		"user in two cases": {path: nodeauthz.Path, body: []byte(`{"apiVersion":"authorization.k8s.io/v1","kind":"SubjectAccessReview","spec":{"user":"system:node:worker-0","User":"system:node:worker-1"}}`), code: http.StatusBadRequest, want: "letter case"},
		"user twice":        {path: nodeauthz.Path, body: []byte(`{"apiVersion":"authorization.k8s.io/v1","kind":"SubjectAccessReview","spec":{"user":"system:node:worker-0","user":"system:node:worker-1"}}`), code: http.StatusBadRequest, want: "duplicate member name"},
	} {
		t.Run(name, func(t *testing.T) {
			rec, _ := post(tc.path, tc.body)
			assert.Equal(t, tc.code, rec.Code)
			assert.Contains(t, rec.Body.String(), tc.want)
			assert.Less(t, rec.Body.Len(), 1024)
		})
	}
	assert.Equal(t, 7.0, decisions(t, reg, "denied"))
	assert.Equal(t, 1.0, decisions(t, reg, "no-opinion"))
	assert.Equal(t, 6.0, decisions(t, reg, "bad-request"))
}

// FuzzParseReview: no input panics; whatever parses is a v1 SubjectAccessReview and Decide
// denies only a removed node's own identity.
func FuzzParseReview(f *testing.F) {
	f.Add(review("system:node:worker-1"))
	f.Add(review("system:node:worker-0"))
	f.Add([]byte(`{"apiVersion":"authorization.k8s.io/v1","kind":"SubjectAccessReview","spec":{"user":"system:node:worker-1\u0000"}}`))
	f.Add([]byte(`{"apiVersion":"authorization.k8s.io/v1","kind":"SubjectAccessReview","spec":{"nonResourceAttributes":{"path":"/version","verb":"get"}}}`))
	f.Add([]byte(`[]`))
	removed := set{names: map[string]bool{"worker-1": true}, synced: true}
	f.Fuzz(func(t *testing.T, body []byte) {
		sar, err := nodeauthz.ParseReview(body)
		if err != nil {
			require.Less(t, len(err.Error()), 2048)
			return
		}
		require.Equal(t, "SubjectAccessReview", sar.Kind)
		if d := nodeauthz.Decide(sar.Spec.User, removed); d.Deny {
			require.Equal(t, "system:node:worker-1", sar.Spec.User)
		}
	})
}

func TestAuthorizationConfig(t *testing.T) {
	data, err := nodeauthz.AuthorizationConfig("/etc/kubernetes/constellation/removed-node-authorizer.conf")
	require.NoError(t, err)
	for _, want := range []string{
		"kind: AuthorizationConfiguration", "failurePolicy: NoOpinion", "request.user.startsWith(\"system:node:\")",
		"kubeConfigFile: /etc/kubernetes/constellation/removed-node-authorizer.conf", "timeout: 1s", "unauthorizedTTL: 1s",
	} {
		assert.Contains(t, string(data), want)
	}
	// The webhook first, then kubeadm's Node and RBAC.
	webhook, node, rbac := strings.Index(string(data), "type: Webhook"), strings.Index(string(data), "type: Node"), strings.Index(string(data), "type: RBAC")
	assert.True(t, webhook >= 0 && webhook < node && node < rbac, "order webhook %d, node %d, rbac %d", webhook, node, rbac)
}

func slogTo(w io.Writer) *slog.Logger { return slog.New(slog.NewTextHandler(w, nil)) }

// decisions reads constellation_nodeauthz_decisions_total{decision}.
func decisions(t *testing.T, reg *prometheus.Registry, decision string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != "constellation_nodeauthz_decisions_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "decision" && l.GetValue() == decision {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
