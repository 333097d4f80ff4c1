package drain_test

import (
	"context"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/openconstellation/constellation/internal/kube/drain"
)

// failFirst makes the first n requests of verb on resource fail with err.
func failFirst(client *fake.Clientset, verb, resource string, n int, err error) *int {
	calls := 0
	client.PrependReactor(verb, resource, func(k8stesting.Action) (bool, runtime.Object, error) {
		calls++
		if calls <= n {
			return true, nil, err
		}
		return false, nil, nil
	})
	return &calls
}

// An API server that restarts or loses its etcd leader while a node is drained: the cordon and
// the listing of the node's pods are retried within the drain's time; a refusal that waiting
// does not change is not.
func TestDrainRetriesTransientAPIErrors(t *testing.T) {
	reset := os.NewSyscallError("read", syscall.ECONNRESET)
	testCases := map[string]struct {
		verb, resource string
		n              int
		err            error
		wantErr        string
	}{
		"cordon: API server restarting (503)": {verb: "patch", resource: "nodes", n: 2, err: apierrors.NewServiceUnavailable("restarting")},
		"cordon: etcd leader failure (500)": {verb: "get", resource: "nodes", n: 1, err: &apierrors.StatusError{ErrStatus: metav1.Status{
			Status: metav1.StatusFailure, Code: 500, Message: "etcdserver: request timed out, possibly due to previous leader failure",
		}}},
		"pods: connection reset":    {verb: "list", resource: "pods", n: 2, err: reset},
		"cordon: forbidden at once": {verb: "patch", resource: "nodes", n: 1, err: apierrors.NewForbidden(corev1.Resource("nodes"), "worker-2", nil), wantErr: "forbidden"},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "worker-2"}})
			calls := failFirst(client, tc.verb, tc.resource, tc.n, tc.err)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			report, err := drain.Drain(ctx, client, "worker-2", drain.Options{Timeout: 20 * time.Second, RetryInterval: 20 * time.Millisecond})
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				assert.Equal(t, 1, *calls, "not retried")
				return
			}
			require.NoError(t, err)
			assert.Greater(t, *calls, tc.n, "retried past the failures")
			assert.True(t, report.Cordoned)
			n, err := client.CoreV1().Nodes().Get(ctx, "worker-2", metav1.GetOptions{})
			require.NoError(t, err)
			assert.True(t, n.Spec.Unschedulable)
		})
	}
}
