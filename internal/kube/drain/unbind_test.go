package drain_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/openconstellation/constellation/internal/kube/drain"
)

// What a drain leaves bound to a removed node (a DaemonSet pod, a static pod's mirror pod, a
// pod terminating that no kubelet confirms) is deleted at once; a pod that a finalizer keeps
// is named with its finalizers and goes once they are removed; pods of other nodes are not
// touched. The node has no Node object any more, as when removal deletes its pods.
func TestDeleteBoundPods(t *testing.T) {
	e := newEnv(t, "unbind")
	e.node("unbind-stays")
	ctx := context.Background()
	e.pod("ds", "unbind-gone", ownedBy("apps/v1", "DaemonSet"))
	e.pod("static", "unbind-gone", mirror)
	e.pod("terminating", "unbind-gone", ownedBy("apps/v1", "DaemonSet"))
	require.NoError(t, e.client.CoreV1().Pods(e.ns).Delete(ctx, "terminating", metav1.DeleteOptions{}))
	require.True(t, e.exists("terminating"), "a pod bound to a node waits for its kubelet")
	e.pod("held", "unbind-gone", ownedBy("apps/v1", "DaemonSet"), func(p *corev1.Pod) { p.Finalizers = []string{"example.com/hold"} })
	e.pod("elsewhere", "unbind-stays", ownedBy("apps/v1", "DaemonSet"))

	deleted, stuck, err := drain.DeleteBoundPods(ctx, e.client, "unbind-gone")
	require.NoError(t, err)
	assert.ElementsMatch(t, []drain.PodRef{{Namespace: "unbind", Name: "ds"}, {Namespace: "unbind", Name: "static"}, {Namespace: "unbind", Name: "terminating"}, {Namespace: "unbind", Name: "held"}}, deleted)
	require.Len(t, stuck, 1)
	assert.Equal(t, "unbind/held: deleted, kept by its finalizers [\"example.com/hold\"] (for their controllers to remove)", stuck[0].String())
	for _, gone := range []string{"ds", "static", "terminating"} {
		assert.False(t, e.exists(gone), gone)
	}
	assert.True(t, e.exists("elsewhere"), "another node's pod stays")

	// Asked again: nothing new is deleted, the held pod still waits for its finalizer.
	deleted, stuck, err = drain.DeleteBoundPods(ctx, e.client, "unbind-gone")
	require.NoError(t, err)
	assert.Empty(t, deleted)
	assert.Len(t, stuck, 1)

	_, err = e.client.CoreV1().Pods(e.ns).Patch(ctx, "held", types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
	require.NoError(t, err)
	deleted, stuck, err = drain.DeleteBoundPods(ctx, e.client, "unbind-gone")
	require.NoError(t, err)
	assert.Empty(t, deleted)
	assert.Empty(t, stuck)
	assert.False(t, e.exists("held"))
}
