package cli

import (
	"bytes"
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/openconstellation/constellation/internal/clusterrecord"
	"github.com/openconstellation/constellation/internal/deploy"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/nodeauthz"
	"github.com/openconstellation/constellation/internal/state"
)

func kubeNode(name string, ready bool) *corev1.Node {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Status:     corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status, Reason: "KubeletNotReady"}}},
	}
}

// authzReport is control plane node's removed-node authorizer report, as its bootstrapper
// writes it (nodeauthz), renewed at renewed.
func authzReport(node string, ready bool, detail string, renewed time.Time) *coordinationv1.Lease {
	readyText := "false"
	if ready {
		readyText = "true"
	}
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name: nodeauthz.ReportName(node), Namespace: nodeauthz.ReportNamespace,
			Labels:      map[string]string{"app.kubernetes.io/component": nodeauthz.ReportComponent},
			Annotations: map[string]string{nodeauthz.ReadyAnnotation: readyText, nodeauthz.DetailAnnotation: detail},
		},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity: ptr.To(node), LeaseDurationSeconds: ptr.To(int32(nodeauthz.ReportDuration / time.Second)),
			RenewTime: ptr.To(metav1.NewMicroTime(renewed)),
		},
	}
}

func healthState() *state.State {
	st := &state.State{Name: "demo", Provider: state.ProviderLocal, Phase: state.Initialized, ClusterID: make([]byte, 32)}
	for _, n := range []struct {
		name string
		role metadata.Role
	}{{"control-plane-0", metadata.ControlPlane}, {"control-plane-1", metadata.ControlPlane}, {"worker-0", metadata.Worker}} {
		st.Nodes = append(st.Nodes, state.Node{Name: n.name, Role: n.role, IPs: []netip.Addr{addrOf(n.name)}})
	}
	return st
}

// The removed-node authorizer fails open, so status counts it in the control plane's health:
// a control plane whose authorizer is not synced, reports nothing, or whose report is stale
// (its bootstrapper is down) makes the control plane DEGRADED, naming the authorizer and why.
func TestStatusControlPlaneHealth(t *testing.T) {
	now := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	fresh := now.Add(-3 * time.Second)
	readyNodes := []runtime.Object{kubeNode("control-plane-0", true), kubeNode("control-plane-1", true), kubeNode("worker-0", true)}
	for name, tc := range map[string]struct {
		objects      []runtime.Object
		wantHealthy  bool
		wantProblems []string
		wantLine     string
	}{
		"healthy": {
			objects:     append(readyNodes, authzReport("control-plane-0", true, "synced", fresh), authzReport("control-plane-1", true, "synced", fresh)),
			wantHealthy: true,
			wantLine:    "Control plane: healthy (every control plane Ready, its removed-node authorizer synced)",
		},
		"authorizer not synced": {
			objects: append(readyNodes, authzReport("control-plane-0", true, "synced", fresh),
				authzReport("control-plane-1", false, "not synced: the removal records have not been listed yet (HTTP 503)", fresh)),
			wantProblems: []string{"control-plane-1: removed-node authorizer not ready: not synced: the removal records have not been listed yet (HTTP 503)"},
			wantLine:     "Control plane: DEGRADED: control-plane-1: removed-node authorizer not ready: not synced",
		},
		"authorizer not serving": {
			objects: append(readyNodes, authzReport("control-plane-0", false, "not serving: connection refused", fresh),
				authzReport("control-plane-1", true, "synced", fresh)),
			wantProblems: []string{"control-plane-0: removed-node authorizer not ready: not serving: connection refused"},
			wantLine:     "Control plane: DEGRADED: control-plane-0: removed-node authorizer not ready: not serving",
		},
		"bootstrapper down: stale report": {
			objects: append(readyNodes, authzReport("control-plane-0", true, "synced", now.Add(-5*time.Minute)),
				authzReport("control-plane-1", true, "synced", fresh)),
			wantProblems: []string{"control-plane-0: removed-node authorizer not ready: its last report is 5m0s old (reports hold 40s): the bootstrapper that serves it is down"},
			wantLine:     "DEGRADED: control-plane-0: removed-node authorizer not ready: its last report is 5m0s old",
		},
		"no report": {
			objects:      append(readyNodes, authzReport("control-plane-1", true, "synced", fresh)),
			wantProblems: []string{"control-plane-0: removed-node authorizer not ready: no report (its bootstrapper has not started it, or boots an image from before the reports)"},
			wantLine:     "DEGRADED: control-plane-0: removed-node authorizer not ready: no report",
		},
		"a control plane NotReady": {
			objects: []runtime.Object{
				kubeNode("control-plane-0", true), kubeNode("control-plane-1", false), kubeNode("worker-0", true),
				authzReport("control-plane-0", true, "synced", fresh), authzReport("control-plane-1", true, "synced", fresh),
			},
			wantProblems: []string{"control-plane-1: NotReady (KubeletNotReady)"},
			wantLine:     "DEGRADED: control-plane-1: NotReady (KubeletNotReady)",
		},
	} {
		t.Run(name, func(t *testing.T) {
			client := fake.NewClientset(tc.objects...)
			r, byName := statusFromState(healthState())
			kubernetesStatusOf(t.Context(), client, now)(r, byName)
			require.NotNil(t, r.ControlPlane)
			assert.Equal(t, tc.wantHealthy, r.ControlPlane.Healthy)
			assert.Equal(t, tc.wantProblems, r.ControlPlane.Problems)
			assert.Nil(t, byName["worker-0"].Authorizer, "workers run no authorizer")
			for _, cp := range []string{"control-plane-0", "control-plane-1"} {
				require.NotNil(t, byName[cp].Authorizer, cp)
			}
			var out bytes.Buffer
			printStatus(&out, r)
			assert.Contains(t, out.String(), tc.wantLine)
		})
	}

	// A stopped cluster has no health to show.
	r, byName := statusFromState(healthState())
	kubernetesStatusOf(t.Context(), fake.NewClientset(readyNodes...), now)(r, byName)
	skipStoppedViews(r)
	assert.Nil(t, r.ControlPlane)
	assert.Nil(t, r.Nodes[0].Authorizer)
}

// init's and apply's wait holds a control plane back while its removed-node authorizer reports
// not ready, saying so in its progress, and lets it go once the report says synced. A
// control plane without any report is not held (images before the reports write none).
func TestWaitReadyWaitsForTheAuthorizer(t *testing.T) {
	verifier := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "verify-cp0", Namespace: clusterrecord.Namespace, Labels: map[string]string{"app.kubernetes.io/name": deploy.VerificationService}},
		Spec:       corev1.PodSpec{NodeName: "control-plane-0"},
		Status:     corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
	want, controlPlanes := map[string]bool{"control-plane-0": true}, map[string]bool{"control-plane-0": true}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	t.Run("not synced, then synced", func(t *testing.T) {
		client := fake.NewClientset(kubeNode("control-plane-0", true), verifier,
			authzReport("control-plane-0", false, "not synced: the removal records have not been listed yet (HTTP 503)", time.Now()))
		out := &lockedBuffer{}
		tm := newPhaseTimer(out)
		prog := newProgress(tm)
		done := make(chan error, 1)
		go func() { done <- waitReady(ctx, tm, prog, client, nil, want, controlPlanes, false) }()
		require.Eventually(t, func() bool {
			return strings.Contains(prog.describe("control-plane-0"), "its removed-node authorizer to be ready (now: not synced")
		}, 10*time.Second, 10*time.Millisecond, "progress: %s", prog.describe("control-plane-0"))
		select {
		case err := <-done:
			t.Fatalf("returned while the authorizer was not synced: %v", err)
		case <-time.After(1500 * time.Millisecond):
		}
		_, err := client.CoordinationV1().Leases(nodeauthz.ReportNamespace).Update(ctx, authzReport("control-plane-0", true, "synced", time.Now()), metav1.UpdateOptions{})
		require.NoError(t, err)
		require.NoError(t, <-done)
		assert.Contains(t, out.String(), "control-plane-0 (Ready, verification service up, removed-node authorizer synced)")
	})
	t.Run("no report", func(t *testing.T) {
		client := fake.NewClientset(kubeNode("control-plane-0", true), verifier)
		out := &lockedBuffer{}
		tm := newPhaseTimer(out)
		require.NoError(t, waitReady(ctx, tm, newProgress(tm), client, nil, want, controlPlanes, false))
		assert.Contains(t, out.String(), "control-plane-0 (Ready, verification service up; its removed-node authorizer: no report")
	})
}

// A rebooted control plane is back only once the authorizer of its new boot reports synced:
// the report of the boot before does not count. A node without any report (a worker, an image
// from before the reports) has nothing to wait for.
func TestAuthorizerBack(t *testing.T) {
	booted := time.Now().Add(-time.Minute).Truncate(time.Second)
	for name, tc := range map[string]struct {
		report *coordinationv1.Lease
		ok     bool
		why    string
	}{
		"no report":               {ok: true},
		"report of the last boot": {report: authzReport("control-plane-0", true, "synced", booted.Add(-time.Second)), why: "its removed-node authorizer to report since it booted"},
		"not synced yet": {
			report: authzReport("control-plane-0", false, "not synced: the removal records have not been listed yet (HTTP 503)", time.Now()),
			why:    "its removed-node authorizer to be ready (now: not synced: the removal records have not been listed yet (HTTP 503))",
		},
		"synced": {report: authzReport("control-plane-0", true, "synced", time.Now()), ok: true},
	} {
		t.Run(name, func(t *testing.T) {
			client := fake.NewClientset()
			if tc.report != nil {
				client = fake.NewClientset(tc.report)
			}
			ok, why, err := authorizerBack(t.Context(), client, "control-plane-0", booted)
			require.NoError(t, err)
			assert.Equal(t, tc.ok, ok)
			assert.Equal(t, tc.why, why)
		})
	}
}
