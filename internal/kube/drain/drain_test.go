package drain_test

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/openconstellation/constellation/internal/kube/drain"
	"github.com/openconstellation/constellation/internal/kube/kubetest"
	"github.com/openconstellation/constellation/internal/pki"
)

// One real kube-apiserver + etcd for the package, with kube-controller-manager running only the
// disruption controller: it computes PodDisruptionBudget status from the pods, and the
// eviction handler decides with that status. A budget the controller has not processed yet
// refuses every eviction ("still being processed"), so without the controller a test would see
// refusals for the wrong reason.
var shared = kubetest.Shared{Options: kubetest.Options{Controllers: []string{"disruption-controller"}}}

func TestMain(m *testing.M) {
	code := m.Run()
	shared.Stop()
	os.Exit(code)
}

// There is no kubelet: pods bound to a node (spec.nodeName) never run. What that means here:
//   - A pod stays Pending. The eviction handler deletes Pending pods without consulting any
//     budget (a pod that never ran cannot be disrupted), so a test that wants a budget to
//     guard a pod makes it Running and Ready through the status subresource, as a kubelet would.
//   - An evicted pod is deleted gracefully: it gets a deletionTimestamp and stays until its
//     kubelet confirms the containers stopped by deleting it with grace period 0. fakeKubelet
//     does that last step for the nodes a test names; pods on other nodes stay terminating.

func cluster(t *testing.T) *kubetest.Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("needs kube-apiserver, etcd and kube-controller-manager")
	}
	return shared.Get(t)
}

// env is one test's namespace and nodes on the shared control plane.
type env struct {
	t      *testing.T
	client kubernetes.Interface
	ns     string
}

func newEnv(t *testing.T, name string) *env {
	t.Helper()
	kube := cluster(t)
	e := &env{t: t, client: kube.Admin, ns: name}
	_, err := e.client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	require.NoError(t, err)
	// The service account admission wants the namespace's default account, which the
	// serviceaccount controller (not running here) would create.
	_, err = e.client.CoreV1().ServiceAccounts(name).Create(context.Background(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	return e
}

func (e *env) node(name string) {
	e.t.Helper()
	_, err := e.client.CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	require.NoError(e.t, err)
	e.t.Cleanup(func() { _ = e.client.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
}

type podOpt func(*corev1.Pod)

func labelled(k, v string) podOpt {
	return func(p *corev1.Pod) { p.Labels = map[string]string{k: v} }
}

func ownedBy(apiVersion, kind string) podOpt {
	return func(p *corev1.Pod) {
		yes := true
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: apiVersion, Kind: kind, Name: "owner", UID: "0b5e7c9a-0000-4000-8000-000000000001", Controller: &yes}}
	}
}

func mirror(p *corev1.Pod) {
	p.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: "6d2f0b"}
}

// pod creates a pod bound to node.
func (e *env) pod(name, node string, opts ...podOpt) *corev1.Pod {
	e.t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: corev1.PodSpec{
			NodeName:   node,
			Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10.1"}},
		},
	}
	for _, o := range opts {
		o(p)
	}
	p, err := e.client.CoreV1().Pods(e.ns).Create(context.Background(), p, metav1.CreateOptions{})
	require.NoError(e.t, err)
	return p
}

// ready marks a pod Running and Ready, as its kubelet would once the containers run.
func (e *env) ready(p *corev1.Pod) {
	e.t.Helper()
	p.Status.Phase = corev1.PodRunning
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
	_, err := e.client.CoreV1().Pods(e.ns).UpdateStatus(context.Background(), p, metav1.UpdateOptions{})
	require.NoError(e.t, err)
}

// finished marks a pod Succeeded, as its kubelet would once the containers exited 0.
func (e *env) finished(p *corev1.Pod) {
	e.t.Helper()
	p.Status.Phase = corev1.PodSucceeded
	_, err := e.client.CoreV1().Pods(e.ns).UpdateStatus(context.Background(), p, metav1.UpdateOptions{})
	require.NoError(e.t, err)
}

// budget creates a PodDisruptionBudget keeping minAvailable pods labelled app=app and waits until
// the disruption controller reports the given disruptionsAllowed.
func (e *env) budget(name, app string, minAvailable int) {
	e.t.Helper()
	min := intstr.FromInt32(int32(minAvailable))
	_, err := e.client.PolicyV1().PodDisruptionBudgets(e.ns).Create(context.Background(), &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: &min,
			Selector:     &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}},
		},
	}, metav1.CreateOptions{})
	require.NoError(e.t, err)
}

func (e *env) waitBudget(name string, allowed int32) {
	e.t.Helper()
	var last policyv1.PodDisruptionBudgetStatus
	require.Eventually(e.t, func() bool {
		pdb, err := e.client.PolicyV1().PodDisruptionBudgets(e.ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		last = pdb.Status
		return pdb.Status.ObservedGeneration == pdb.Generation && pdb.Status.DisruptionsAllowed == allowed
	}, 60*time.Second, 50*time.Millisecond, "disruption controller never reported %d allowed disruptions for %s (last status %+v); log: %s",
		allowed, name, last, shared.Get(e.t).LogTail("kube-controller-manager"))
}

func (e *env) exists(name string) bool {
	e.t.Helper()
	_, err := e.client.CoreV1().Pods(e.ns).Get(context.Background(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false
	}
	require.NoError(e.t, err)
	return true
}

// fakeKubelet finishes the termination of pods on the given nodes: what a kubelet does once a
// deleted pod's containers stopped (delete with grace period 0). It runs until the test ends.
func (e *env) fakeKubelet(nodes ...string) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	e.t.Cleanup(func() { cancel(); wg.Wait() })
	for _, node := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			zero := int64(0)
			for {
				list, err := e.client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
					FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String(),
				})
				if err == nil {
					for _, p := range list.Items {
						if p.DeletionTimestamp != nil {
							_ = e.client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{
								GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &p.UID},
							})
						}
					}
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(50 * time.Millisecond):
				}
			}
		}()
	}
}

func refs(ns string, names ...string) []drain.PodRef {
	var r []drain.PodRef
	for _, n := range names {
		r = append(r, drain.PodRef{Namespace: ns, Name: n})
	}
	return r
}

var fast = drain.Options{Timeout: 30 * time.Second, RetryInterval: 100 * time.Millisecond}

func TestDrainEvictsPodsAndSkipsDaemonSetAndStaticPods(t *testing.T) {
	e := newEnv(t, "evict")
	e.node("evict-w0")
	e.node("evict-w1")
	e.pod("plain", "evict-w0")
	e.ready(e.pod("replica", "evict-w0", ownedBy("apps/v1", "ReplicaSet")))
	e.finished(e.pod("done", "evict-w0", ownedBy("batch/v1", "Job")))
	e.ready(e.pod("agent", "evict-w0", ownedBy("apps/v1", "DaemonSet")))
	e.ready(e.pod("static-evict-w0", "evict-w0", mirror))
	e.ready(e.pod("elsewhere", "evict-w1"))
	e.fakeKubelet("evict-w0", "evict-w1")

	plan, err := drain.PlanDrain(context.Background(), e.client, "evict-w0")
	require.NoError(t, err)
	assert.False(t, plan.Cordoned)
	assert.Equal(t, refs("evict", "done", "plain", "replica"), plan.Evict)
	assert.Equal(t, refs("evict", "plain"), plan.Unmanaged, "only the pod without a controller is gone for good")
	assert.Equal(t, []drain.SkippedPod{
		{Pod: drain.PodRef{Namespace: "evict", Name: "agent"}, Reason: drain.SkipDaemonSet},
		{Pod: drain.PodRef{Namespace: "evict", Name: "static-evict-w0"}, Reason: drain.SkipMirror},
	}, plan.Skip)
	node, err := e.client.CoreV1().Nodes().Get(context.Background(), "evict-w0", metav1.GetOptions{})
	require.NoError(t, err)
	assert.False(t, node.Spec.Unschedulable, "planning changes nothing")

	report, err := drain.Drain(context.Background(), e.client, "evict-w0", fast)
	require.NoError(t, err)
	assert.True(t, report.Cordoned)
	assert.Equal(t, refs("evict", "done", "plain", "replica"), report.Evicted)
	assert.Equal(t, plan.Skip, report.Skipped)

	for _, name := range []string{"plain", "replica", "done"} {
		assert.False(t, e.exists(name), name)
	}
	for _, name := range []string{"agent", "static-evict-w0", "elsewhere"} {
		assert.True(t, e.exists(name), "%s stays", name)
	}
	node, err = e.client.CoreV1().Nodes().Get(context.Background(), "evict-w0", metav1.GetOptions{})
	require.NoError(t, err)
	assert.True(t, node.Spec.Unschedulable)
	other, err := e.client.CoreV1().Nodes().Get(context.Background(), "evict-w1", metav1.GetOptions{})
	require.NoError(t, err)
	assert.False(t, other.Spec.Unschedulable)

	require.NoError(t, drain.Delete(context.Background(), e.client, "evict-w0"))
	_, err = e.client.CoreV1().Nodes().Get(context.Background(), "evict-w0", metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err), "node deleted: %v", err)
	assert.NoError(t, drain.Delete(context.Background(), e.client, "evict-w0"), "deleting a deleted node is done, not an error")
}

// A drain before a reboot keeps pods without a controller (the node's kubelet runs them again
// after the reboot; evicted, they would be gone), and the node is uncordoned afterwards.
func TestDrainKeepUnmanagedThenUncordon(t *testing.T) {
	e := newEnv(t, "keep")
	e.node("keep-w0")
	e.ready(e.pod("plain", "keep-w0"))
	e.ready(e.pod("replica", "keep-w0", ownedBy("apps/v1", "ReplicaSet")))
	e.fakeKubelet("keep-w0")

	opts := fast
	opts.KeepUnmanaged = true
	report, err := drain.Drain(context.Background(), e.client, "keep-w0", opts)
	require.NoError(t, err)
	assert.Equal(t, refs("keep", "replica"), report.Evicted)
	assert.Equal(t, []drain.SkippedPod{{Pod: drain.PodRef{Namespace: "keep", Name: "plain"}, Reason: drain.SkipUnmanaged}}, report.Skipped)
	assert.True(t, e.exists("plain"))

	changed, err := drain.Uncordon(context.Background(), e.client, "keep-w0")
	require.NoError(t, err)
	assert.True(t, changed)
	node, err := e.client.CoreV1().Nodes().Get(context.Background(), "keep-w0", metav1.GetOptions{})
	require.NoError(t, err)
	assert.False(t, node.Spec.Unschedulable)
	changed, err = drain.Uncordon(context.Background(), e.client, "keep-w0")
	require.NoError(t, err)
	assert.False(t, changed, "uncordoning a schedulable node changes nothing")
	_, err = drain.Uncordon(context.Background(), e.client, "no-such-node")
	assert.ErrorIs(t, err, drain.ErrNodeNotFound)
}

func TestDrainCordonIsIdempotent(t *testing.T) {
	e := newEnv(t, "cordon")
	e.node("cordon-w0")

	first, err := drain.Drain(context.Background(), e.client, "cordon-w0", fast)
	require.NoError(t, err)
	assert.True(t, first.Cordoned)
	assert.Empty(t, first.Evicted)

	plan, err := drain.PlanDrain(context.Background(), e.client, "cordon-w0")
	require.NoError(t, err)
	assert.True(t, plan.Cordoned)

	second, err := drain.Drain(context.Background(), e.client, "cordon-w0", fast)
	require.NoError(t, err)
	assert.False(t, second.Cordoned, "already cordoned: nothing changed")
	node, err := e.client.CoreV1().Nodes().Get(context.Background(), "cordon-w0", metav1.GetOptions{})
	require.NoError(t, err)
	assert.True(t, node.Spec.Unschedulable)
}

func TestDrainMissingNode(t *testing.T) {
	e := newEnv(t, "missing")
	_, err := drain.Drain(context.Background(), e.client, "no-such-node", fast)
	require.Error(t, err)
	assert.ErrorIs(t, err, drain.ErrNodeNotFound)
	assert.True(t, apierrors.IsNotFound(err), "the API server's answer is kept: %v", err)
	assert.Contains(t, err.Error(), `"no-such-node"`)

	_, err = drain.PlanDrain(context.Background(), e.client, "no-such-node")
	assert.ErrorIs(t, err, drain.ErrNodeNotFound)
}

func TestDrainRespectsDisruptionBudget(t *testing.T) {
	e := newEnv(t, "budget")
	e.node("budget-w0")
	e.node("budget-w1")
	e.node("budget-w2")
	e.fakeKubelet("budget-w0", "budget-w1") // budget-w2's kubelet never finishes a termination
	e.ready(e.pod("web-0", "budget-w0", labelled("app", "web")))
	// Pending (never ran): the eviction handler deletes it without asking the budget.
	e.pod("web-pending", "budget-w0", labelled("app", "web"))
	e.pod("batch", "budget-w0")
	e.budget("web", "web", 1)
	e.waitBudget("web", 0)

	start := time.Now()
	// The timeout leaves room for several eviction attempts of every pod even on a loaded
	// machine: the budget is named only once the eviction of web-0 was refused at least once.
	report, err := drain.Drain(context.Background(), e.client, "budget-w0", drain.Options{Timeout: 6 * time.Second, RetryInterval: 100 * time.Millisecond})
	require.Error(t, err)
	t.Logf("after %v: %v", time.Since(start).Round(time.Millisecond), err)
	var timeout *drain.TimeoutError
	require.ErrorAs(t, err, &timeout)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	require.Len(t, timeout.Pods, 1)
	stuck := timeout.Pods[0]
	assert.Equal(t, drain.PodRef{Namespace: "budget", Name: "web-0"}, stuck.Pod)
	assert.Equal(t, []string{"budget/web"}, stuck.Budgets)
	assert.Contains(t, stuck.Reason, "Cannot evict pod as it would violate the pod's disruption budget")
	assert.Contains(t, stuck.Reason, "The disruption budget web needs 1 healthy pods and has 1 currently")
	assert.Contains(t, err.Error(), "budget/web-0 blocked by PodDisruptionBudget budget/web")
	assert.Contains(t, err.Error(), "after 6s")
	assert.Equal(t, refs("budget", "batch", "web-pending"), report.Evicted, "what could go went")
	assert.Equal(t, report, timeout.Report)
	assert.True(t, e.exists("web-0"), "the budget kept it")

	// A second healthy replica elsewhere: the budget allows one disruption, the drain finishes.
	e.ready(e.pod("web-1", "budget-w1", labelled("app", "web")))
	e.waitBudget("web", 1)
	report, err = drain.Drain(context.Background(), e.client, "budget-w0", fast)
	require.NoError(t, err)
	assert.False(t, report.Cordoned, "cordoned by the first attempt")
	assert.Equal(t, refs("budget", "web-0"), report.Evicted)
	assert.False(t, e.exists("web-0"))
	assert.True(t, e.exists("web-1"))

	// A pod that is evicted but whose kubelet never confirms the stop is named as terminating.
	e.pod("slow", "budget-w2")
	_, err = drain.Drain(context.Background(), e.client, "budget-w2", drain.Options{Timeout: time.Second, RetryInterval: 100 * time.Millisecond})
	require.ErrorAs(t, err, &timeout)
	require.Len(t, timeout.Pods, 1)
	assert.Equal(t, "slow", timeout.Pods[0].Pod.Name)
	assert.Empty(t, timeout.Pods[0].Budgets)
	assert.Contains(t, timeout.Pods[0].Reason, "evicted, still terminating")
	assert.Contains(t, err.Error(), "grace period 30s")
}

func TestDrainStopsWithTheCallersContext(t *testing.T) {
	e := newEnv(t, "caller")
	e.node("caller-w0")
	e.pod("stays", "caller-w0") // no kubelet confirms its end: it stays terminating
	opts := drain.Options{Timeout: time.Minute, RetryInterval: 100 * time.Millisecond}

	// The caller's deadline comes first: a timeout, reported with the caller's limit.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err := drain.Drain(ctx, e.client, "caller-w0", opts)
	var timeout *drain.TimeoutError
	require.ErrorAs(t, err, &timeout)
	assert.LessOrEqual(t, timeout.Timeout, time.Second)
	assert.Greater(t, timeout.Timeout, time.Duration(0))
	assert.Equal(t, "stays", timeout.Pods[0].Pod.Name)

	// The caller cancels: no timeout claimed, the pods still named.
	ctx, cancel = context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	_, err = drain.Drain(ctx, e.client, "caller-w0", opts)
	require.ErrorIs(t, err, context.Canceled)
	assert.False(t, errors.As(err, &timeout))
	assert.Contains(t, err.Error(), "pods still on the node: caller/stays: evicted, still terminating")
}

func TestDrainPermanentRefusalFailsFast(t *testing.T) {
	kube := cluster(t)
	e := newEnv(t, "forbidden")
	e.node("forbidden-w0")
	e.pod("p", "forbidden-w0")

	// A client that may read and cordon nodes and list pods, but not evict: the drain must
	// not sit out its timeout on a refusal that waiting does not change.
	client := limitedClient(t, kube)
	start := time.Now()
	_, err := drain.Drain(context.Background(), client, "forbidden-w0", drain.Options{Timeout: time.Minute, RetryInterval: 100 * time.Millisecond})
	require.Error(t, err)
	assert.True(t, apierrors.IsForbidden(err), "%v", err)
	assert.NotErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), "forbidden/p")
	assert.Less(t, time.Since(start), 30*time.Second, "did not wait for the timeout")
}

func TestStuckPodString(t *testing.T) {
	testCases := map[string]struct {
		pod  drain.StuckPod
		want string
	}{
		"budget": {
			pod:  drain.StuckPod{Pod: drain.PodRef{Namespace: "a", Name: "b"}, Budgets: []string{"a/x", "a/y"}, Reason: "why"},
			want: "a/b blocked by PodDisruptionBudget a/x, a/y (why)",
		},
		"terminating": {
			pod:  drain.StuckPod{Pod: drain.PodRef{Namespace: "a", Name: "b"}, Reason: "evicted, still terminating"},
			want: "a/b: evicted, still terminating",
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, tc.pod.String())
		})
	}
	err := &drain.TimeoutError{Node: "w", Timeout: time.Second, Pods: []drain.StuckPod{testCases["budget"].pod, testCases["terminating"].pod}}
	assert.Equal(t, `draining node "w": 2 pod(s) still on the node after 1s: a/b blocked by PodDisruptionBudget a/x, a/y (why); a/b: evicted, still terminating`, err.Error())
	assert.True(t, errors.Is(err, context.DeadlineExceeded))
}

// limitedClient authenticates as a user who may get and patch nodes, list pods and read
// budgets, but not evict.
func limitedClient(t *testing.T, kube *kubetest.Cluster) kubernetes.Interface {
	t.Helper()
	ctx := context.Background()
	_, err := kube.Admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "no-evict"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "patch"}},
			{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list"}},
			{APIGroups: []string{"policy"}, Resources: []string{"poddisruptionbudgets"}, Verbs: []string{"list"}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = kube.Admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "no-evict"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "no-evict"},
		Subjects:   []rbacv1.Subject{{Kind: "User", Name: "no-evict"}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	now := time.Now()
	cert, key, err := kube.PKI.CA.NewLeaf(pki.Leaf{CommonName: "no-evict", Client: true, NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour)})
	require.NoError(t, err)
	keyPEM, err := pki.EncodeKey(key)
	require.NoError(t, err)
	client, err := kube.ClientFor(rest.Config{TLSClientConfig: rest.TLSClientConfig{CertData: pki.EncodeCert(cert), KeyData: keyPEM}})
	require.NoError(t, err)
	return client
}
