package nodeauthz_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/openconstellation/constellation/internal/nodeauthz"
)

// The readiness endpoint says "synced" only once the removal records are listed: before, the
// authorizer has no opinion on anything, so a control plane relying on it is not whole.
func TestReadiness(t *testing.T) {
	for name, tc := range map[string]struct {
		synced bool
		method string
		code   int
		want   string
	}{
		"synced":            {synced: true, method: http.MethodGet, code: http.StatusOK, want: "synced\n"},
		"not synced":        {method: http.MethodGet, code: http.StatusServiceUnavailable, want: "not synced: the removal records have not been listed yet\n"},
		"HEAD":              {synced: true, method: http.MethodHead, code: http.StatusOK},
		"POST is no review": {synced: true, method: http.MethodPost, code: http.StatusNotFound, want: "POST /authorize or GET /readyz only\n"},
	} {
		t.Run(name, func(t *testing.T) {
			h, err := nodeauthz.NewHandler(set{synced: tc.synced}, nil, nil, nil)
			require.NoError(t, err)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(tc.method, nodeauthz.ReadyPath, nil))
			assert.Equal(t, tc.code, rec.Code)
			if tc.method != http.MethodHead {
				assert.Equal(t, tc.want, rec.Body.String())
			}
		})
	}
}

func reportLease(name string, ready string, renewed time.Time, seconds int32) *coordinationv1.Lease {
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: nodeauthz.ReportNamespace,
			Labels:      map[string]string{"app.kubernetes.io/component": nodeauthz.ReportComponent},
			Annotations: map[string]string{nodeauthz.ReadyAnnotation: ready, nodeauthz.DetailAnnotation: "detail\x1b[2J"},
		},
		Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: ptr.To(seconds)},
	}
	if !renewed.IsZero() {
		l.Spec.RenewTime = ptr.To(metav1.NewMicroTime(renewed))
	}
	return l
}

// Reports are read from the cluster and assessed: a report holds for its lease's duration; a
// stale one means the bootstrapper that serves the authorizer is down; a missing one that it
// has not started it (or boots an image from before the reports). Malformed leases report
// nothing, and what a report says is shown escaped.
func TestReportsAndAssess(t *testing.T) {
	now := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	objects := []runtime.Object{
		reportLease(nodeauthz.ReportName("cp-ready"), "true", now.Add(-5*time.Second), 40),
		reportLease(nodeauthz.ReportName("cp-not-synced"), "false", now.Add(-time.Second), 40),
		reportLease(nodeauthz.ReportName("cp-stale"), "true", now.Add(-2*time.Minute), 40),
		reportLease(nodeauthz.ReportName("cp-no-renew-time"), "true", time.Time{}, 40),
		reportLease(nodeauthz.ReportName("cp-no-duration"), "true", now, 0),
		reportLease("someone-elses-lease", "true", now, 40),
	}
	unlabelled := reportLease(nodeauthz.ReportName("cp-unlabelled"), "true", now, 40)
	unlabelled.Labels = nil
	objects = append(objects, unlabelled)
	client := fake.NewClientset(objects...)

	reports, err := nodeauthz.Reports(t.Context(), client)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"cp-ready", "cp-not-synced", "cp-stale"}, keys(reports))

	for node, want := range map[string]nodeauthz.Health{
		"cp-ready":      {Ready: true, Reported: true, Why: `detail\x1b[2J`},
		"cp-not-synced": {Reported: true, Why: `detail\x1b[2J`},
		"cp-stale":      {Reported: true, Why: "its last report is 2m0s old (reports hold 40s): the bootstrapper that serves it is down"},
		"cp-missing":    {Why: "no report (its bootstrapper has not started it, or boots an image from before the reports)"},
	} {
		t.Run(node, func(t *testing.T) {
			assert.Equal(t, want, nodeauthz.Assess(reports, node, now))
		})
	}

	require.NoError(t, nodeauthz.DeleteReport(t.Context(), client, "cp-ready"))
	require.NoError(t, nodeauthz.DeleteReport(t.Context(), client, "cp-ready"), "a report that is gone is no error")
	reports, err = nodeauthz.Reports(t.Context(), client)
	require.NoError(t, err)
	assert.NotContains(t, reports, "cp-ready")
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
