package cli

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/openconstellation/constellation/internal/clusterrecord"
	"github.com/openconstellation/constellation/internal/deploy"
)

// An apply that only checks the nodes it did not change says nothing of them when they are
// ready, also when its first look failed (the API server restarting): that look saw nothing,
// so the first look that reached the API server decides. A node registered before the
// command started is said so, not given a negative time.
func TestWaitReadyAfterAFailedLook(t *testing.T) {
	readyNode := func(name string, created time.Time) *corev1.Node {
		return &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(created)},
			Status:     corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}},
		}
	}
	verifier := func(node string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "verify-" + node, Namespace: clusterrecord.Namespace, Labels: map[string]string{"app.kubernetes.io/name": deploy.VerificationService}},
			Spec:       corev1.PodSpec{NodeName: node},
			Status:     corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
		}
	}
	for name, tc := range map[string]struct {
		quiet bool
		want  []string
	}{
		"quiet": {quiet: true},
		"announced": {want: []string{
			"join       worker-0 (Node registered before this command started)",
			"ready      worker-0 (Ready, verification service up)",
			"all ready  1 nodes",
		}},
	} {
		t.Run(name, func(t *testing.T) {
			client := fake.NewClientset(readyNode("worker-0", time.Now().Add(-time.Minute)), verifier("worker-0"))
			failures := 2
			client.PrependReactor("list", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
				if failures > 0 {
					failures--
					return true, nil, errors.New("dial tcp 127.0.0.1:6443: connect: connection refused")
				}
				return false, nil, nil
			})
			out := &lockedBuffer{}
			tm := newPhaseTimer(out)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			require.NoError(t, waitReady(ctx, tm, newProgress(tm), client, nil, map[string]bool{"worker-0": true}, nil, tc.quiet))
			assert.Zero(t, failures, "the failed looks were made")
			var lines []string
			for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
				if l != "" {
					lines = append(lines, l)
				}
			}
			require.Len(t, lines, len(tc.want), "%s", out)
			for i, want := range tc.want {
				assert.Contains(t, lines[i], want)
			}
		})
	}
}
