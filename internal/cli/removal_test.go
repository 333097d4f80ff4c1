package cli

import (
	"context"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/openconstellation/constellation/internal/attestation/akca"
	"github.com/openconstellation/constellation/internal/clusterrecord"
	"github.com/openconstellation/constellation/internal/deploy"
	"github.com/openconstellation/constellation/internal/kube/kubetest"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/nodeauthz"
	"github.com/openconstellation/constellation/internal/pki"
	"github.com/openconstellation/constellation/internal/state"
	"github.com/openconstellation/constellation/internal/testnet"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/measurements/measurementstest"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// TestRemovedNodeReadsNoSecretWhileAuthorizerIsDown attacks a removed worker's kubelet
// credential in the removed-node authorizer's fail-open window: the API server is configured
// as a control plane runs it (the authorizer's webhook, then Node, then RBAC; NodeRestriction;
// the objects deploy applies at init, the removed-nodes admission policy among them), and the
// authorizer does not run, so the webhook has no opinion and the Node authorizer decides
// alone. The Node authorizer lets a node read every Secret a pod bound to it references, so
// what removal leaves bound to the node decides what the node still reads: a DaemonSet pod
// (drain leaves those), a static pod's mirror pod, a pod already terminating, a pod held by a
// finalizer. Removal runs through reconciler.remove, what apply runs for a node it removes;
// it is killed once while it waits for the held pod, and the next apply (syncWithPlatform)
// finishes it.
//
// Before the fix, removal deleted the Node and the machine but left the pods: the removed
// node read the Secret rotated after its removal.
func TestRemovedNodeReadsNoSecretWhileAuthorizerIsDown(t *testing.T) {
	if testing.Short() {
		t.Skip("runs kube-apiserver and etcd")
	}
	unserved := testnet.Addr(t) // where the API server looks for the authorizer: nothing listens
	filesDir := t.TempDir()
	kube := kubetest.Start(t, kubetest.Options{AuthorizationConfig: func(pkiDir string) (string, error) {
		if err := nodeauthz.WriteAPIServerFiles(filesDir, filepath.Join(pkiDir, pki.CACert), unserved); err != nil {
			return "", err
		}
		return filepath.Join(filesDir, filepath.Base(nodeauthz.AuthorizationConfigFile)), nil
	}})
	ctx := t.Context()
	admin := kube.Admin
	deployAsInit(t, admin)

	worker0, worker1 := kubeletClient(t, kube, "worker-0"), kubeletClient(t, kube, "worker-1")
	nodeUIDs := map[string]types.UID{}
	for name, c := range map[string]kubernetes.Interface{"worker-0": worker0, "worker-1": worker1} {
		n, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		require.NoError(t, err, "%s registers its Node", name)
		nodeUIDs[name] = n.UID
	}

	const ns = "shop"
	_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
	// The service account admission wants the namespace's default account, which the
	// serviceaccount controller (not running here) would create.
	_, err = admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	for _, name := range []string{"db-password", "old-token", "held-token"} {
		_, err := admin.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string][]byte{"value": []byte("v1")},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	ds := agentDaemonSet(t, admin, ns)
	owner := metav1.OwnerReference{APIVersion: "apps/v1", Kind: "DaemonSet", Name: ds.Name, UID: ds.UID, Controller: ptr.To(true)}
	// What the DaemonSet controller and the scheduler make: one pod per node, bound to it.
	for _, node := range []string{"worker-0", "worker-1"} {
		createPod(t, admin, secretPod(ns, "agent-"+node, node, "db-password", owner))
	}
	// A pod of the DaemonSet's previous revision, terminating: its kubelet has not
	// confirmed its end.
	createPod(t, admin, secretPod(ns, "agent-old-worker-1", "worker-1", "old-token", owner))
	require.NoError(t, admin.CoreV1().Pods(ns).Delete(ctx, "agent-old-worker-1", metav1.DeleteOptions{}))
	// A pod that a finalizer keeps after its deletion, until its controller lets it go.
	held := secretPod(ns, "agent-held-worker-1", "worker-1", "held-token", owner)
	held.Finalizers = []string{"example.com/hold"}
	createPod(t, admin, held)
	// The mirror pod of a static pod the node's kubelet runs.
	createPod(t, admin, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "static-worker-1", Namespace: metav1.NamespaceSystem,
			Annotations:     map[string]string{corev1.MirrorPodAnnotationKey: "hash"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: "worker-1", UID: nodeUIDs["worker-1"], Controller: ptr.To(true)}},
		},
		Spec: corev1.PodSpec{NodeName: "worker-1", Containers: []corev1.Container{{Name: "static", Image: "registry.example/static:1"}}},
	})

	for _, secret := range []string{"db-password", "old-token", "held-token"} {
		_, err := worker1.CoreV1().Secrets(ns).Get(ctx, secret, metav1.GetOptions{})
		require.NoError(t, err, "before the removal worker-1 reads %s through a pod bound to it (the Node authorizer's graph)", secret)
	}

	// apply removes worker-1: killed while it waits for the held pod.
	st, statePath := removalState(t)
	platform := &machinesPlatform{machines: map[string]metadata.Role{"control-plane-0": metadata.ControlPlane, "worker-0": metadata.Worker, "worker-1": metadata.Worker}}
	newReconciler := func(out *lockedBuffer) *reconciler {
		tm := newPhaseTimer(out)
		return &reconciler{out: out, t: tm, prog: newProgress(tm), client: admin, restConfig: kube.AdminConfig, platform: platform,
			st: st, statePath: statePath, o: scaleOptions{drainTimeout: time.Minute}, revokeWait: 2 * time.Second}
	}
	out := &lockedBuffer{}
	killed, kill := context.WithCancel(ctx)
	defer kill()
	r := newReconciler(out)
	stop := r.prog.start(killed)
	go whenOutputNames(killed, out, "agent-held-worker-1", kill)
	err = r.remove(killed, state.Node{Name: "worker-1", Role: metadata.Worker, IPs: []netip.Addr{addrOf("worker-1")}})
	stop()
	t.Logf("first apply:\n%s", out)
	assert.Error(t, err, "the first apply was killed while the held pod was still there")
	waiting := out.String()
	assert.Contains(t, waiting, "waiting", "the removal says what it waits for")
	assert.Contains(t, waiting, "example.com/hold", "and what holds the pod")

	// The next apply finishes the removal; the pod's controller lets it go meanwhile.
	out2 := &lockedBuffer{}
	r = newReconciler(out2)
	stop = r.prog.start(ctx)
	released, release := context.WithCancel(ctx)
	defer release()
	go whenOutputNames(released, out2, "agent-held-worker-1", func() {
		_, err := admin.CoreV1().Pods(ns).Patch(ctx, "agent-held-worker-1", types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
		assert.NoError(t, err)
	})
	err = r.syncWithPlatform(ctx)
	stop()
	t.Logf("next apply:\n%s", out2)
	require.NoError(t, err)
	require.False(t, hasNode(st, "worker-1"), "worker-1 is recorded as removed")
	pods, err := admin.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", "worker-1").String()})
	require.NoError(t, err)
	assert.Empty(t, pods.Items, "no pod is bound to the removed node")

	// The Secrets are rotated after the removal.
	for _, secret := range []string{"db-password", "old-token", "held-token"} {
		_, err := admin.CoreV1().Secrets(ns).Update(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: secret}, Data: map[string][]byte{"value": []byte("v2")},
		}, metav1.UpdateOptions{})
		require.NoError(t, err)
	}
	for _, secret := range []string{"db-password", "old-token", "held-token"} {
		got, err := worker1.CoreV1().Secrets(ns).Get(ctx, secret, metav1.GetOptions{})
		// Refused: no authorizer allows it. As one of them (the webhook) failed, the API
		// server answers 500 naming that failure instead of 403.
		if assert.Error(t, err, "the removed node reads %s with the authorizer down: %q", secret, got.Data["value"]) {
			assert.True(t, apierrors.IsForbidden(err) || apierrors.IsInternalError(err), "%s: %v", secret, err)
		}
		assert.False(t, nodeMay(t, admin, "worker-1", "get", ns, secret), "the API server's decision on worker-1 reading %s", secret)
	}
	assert.True(t, nodeMay(t, admin, "worker-0", "get", ns, "db-password"), "a node that stays")
	got, err := worker0.CoreV1().Secrets(ns).Get(ctx, "db-password", metav1.GetOptions{})
	if assert.NoError(t, err, "a node that stays reads what its pods use") {
		assert.Equal(t, "v2", string(got.Data["value"]))
	}

	// Nothing binds a pod to the removed name again: not its kubelet (a mirror pod, its
	// Node), not a controller, scheduler or administrator.
	_, err = worker1.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "worker-1"}}, metav1.CreateOptions{})
	assert.True(t, apierrors.IsForbidden(err), "the removed node re-creates its Node: %v", err)
	_, err = worker1.CoreV1().Pods(metav1.NamespaceSystem).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "static-worker-1", Namespace: metav1.NamespaceSystem,
			Annotations:     map[string]string{corev1.MirrorPodAnnotationKey: "hash"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: "worker-1", UID: nodeUIDs["worker-1"], Controller: ptr.To(true)}},
		},
		Spec: corev1.PodSpec{NodeName: "worker-1", Containers: []corev1.Container{{Name: "static", Image: "registry.example/static:1"}}},
	}, metav1.CreateOptions{})
	// NodeRestriction refuses first: a mirror pod must name its node's Node object, gone.
	assert.True(t, apierrors.IsForbidden(err) || apierrors.IsNotFound(err), "the removed node creates a mirror pod: %v", err)
	_, err = admin.CoreV1().Pods(ns).Create(ctx, secretPod(ns, "agent-worker-1", "worker-1", "db-password", owner), metav1.CreateOptions{})
	assert.True(t, apierrors.IsForbidden(err), "a pod is created bound to the removed node: %v", err)
	assert.ErrorContains(t, err, "worker-1 was removed from the cluster")
	unbound := secretPod(ns, "agent-unbound", "", "db-password", owner)
	createPod(t, admin, unbound)
	err = admin.CoreV1().Pods(ns).Bind(ctx, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: "agent-unbound", Namespace: ns},
		Target:     corev1.ObjectReference{Kind: "Node", Name: "worker-1"},
	}, metav1.CreateOptions{})
	assert.True(t, apierrors.IsForbidden(err), "a pod is bound to the removed node: %v", err)
	require.NoError(t, admin.CoreV1().Pods(ns).Bind(ctx, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: "agent-unbound", Namespace: ns},
		Target:     corev1.ObjectReference{Kind: "Node", Name: "worker-0"},
	}, metav1.CreateOptions{}), "binding to a node that stays works")

	// Run again, the removal changes nothing and succeeds.
	require.NoError(t, newReconciler(&lockedBuffer{}).remove(ctx, state.Node{Name: "worker-1", Role: metadata.Worker, IPs: []netip.Addr{addrOf("worker-1")}}))
}

// deployAsInit records the cluster and applies what deploy applies at init.
func deployAsInit(t *testing.T, admin kubernetes.Interface) {
	t.Helper()
	ctx := t.Context()
	_, err := admin.CoreV1().Secrets(clusterrecord.Namespace).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: clusterrecord.MasterSecretName},
		Data:       map[string][]byte{clusterrecord.MasterSecretKey: []byte(`{"key":"","salt":""}`)},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = admin.CoreV1().ConfigMaps(clusterrecord.Namespace).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: clusterrecord.ClusterConfigMapName},
		Data:       map[string]string{clusterrecord.ClusterKey: `{}`},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	ca, err := akca.New("local AK CA", time.Now(), time.Hour)
	require.NoError(t, err)
	require.NoError(t, deploy.Apply(ctx, admin, deploy.Config{
		Image: "localhost/constellation/services:3f2a9c0d1e",
		Platform: deploy.PlatformFacts{
			Name: "local", MetadataURL: "http://10.42.0.1:8080", TPM: "/run/constellation/tpm.sock", TPMKind: deploy.TPMSocket,
		},
		Attestation: choose.Reference{Variant: variant.QEMUVTPM, Values: choose.Values{
			Measurements: measurements.ReferenceSets{{Name: "image-v1", Measurements: measurementstest.Image(variant.QEMUVTPM, nil)}},
			AKRoots:      string(pki.EncodeCert(ca.Certificate())),
		}},
	}, nil))
}

// nodeMay asks the API server (a SubjectAccessReview) whether node's kubelet credential may
// verb the Secret ns/name: the decision of every authorizer, as for a request of the node.
func nodeMay(t *testing.T, admin kubernetes.Interface, node, verb, ns, name string) bool {
	t.Helper()
	got, err := admin.AuthorizationV1().SubjectAccessReviews().Create(t.Context(), &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: "system:node:" + node, Groups: []string{"system:nodes", "system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: verb, Resource: "secrets", Name: name},
	}}, metav1.CreateOptions{})
	require.NoError(t, err)
	return got.Status.Allowed
}

// kubeletClient authenticates as node name's kubelet, with a client certificate as the join
// service issues it.
func kubeletClient(t *testing.T, kube *kubetest.Cluster, name string) kubernetes.Interface {
	t.Helper()
	c, err := kube.NodeClient(name)
	require.NoError(t, err)
	return c
}

func agentDaemonSet(t *testing.T, admin kubernetes.Interface, ns string) *appsv1.DaemonSet {
	t.Helper()
	labels := map[string]string{"app": "agent"}
	ds, err := admin.AppsV1().DaemonSets(ns).Create(t.Context(), &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "agent"},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       secretPod(ns, "", "", "db-password", metav1.OwnerReference{}).Spec,
			},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	return ds
}

// secretPod is a pod on node (unbound when empty) that mounts secret.
func secretPod(ns, name, node, secret string, owner metav1.OwnerReference) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": "agent"}},
		Spec: corev1.PodSpec{
			NodeName: node,
			Containers: []corev1.Container{{
				Name: "agent", Image: "registry.example/agent:1",
				VolumeMounts: []corev1.VolumeMount{{Name: "secret", MountPath: "/secret"}},
			}},
			Volumes: []corev1.Volume{{Name: "secret", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: secret}}}},
		},
	}
	if owner.Name != "" {
		p.OwnerReferences = []metav1.OwnerReference{owner}
	}
	return p
}

func createPod(t *testing.T, c kubernetes.Interface, p *corev1.Pod) {
	t.Helper()
	_, err := c.CoreV1().Pods(p.Namespace).Create(t.Context(), p, metav1.CreateOptions{})
	require.NoError(t, err, "creating pod %s/%s", p.Namespace, p.Name)
}

// removalState is the state file of a cluster of control-plane-0, worker-0 and worker-1.
func removalState(t *testing.T) (*state.State, string) {
	t.Helper()
	now := time.Now().UTC()
	st := &state.State{
		Version: state.Version1, Name: "demo", Provider: state.ProviderLocal, Phase: state.Initialized,
		CreatedAt: now, InitializedAt: now, InitEndpoint: "10.42.0.10:9000",
		ClusterID: make([]byte, 32), MeasurementSalt: make([]byte, 32),
	}
	for _, n := range []struct {
		name string
		role metadata.Role
	}{{"control-plane-0", metadata.ControlPlane}, {"worker-0", metadata.Worker}, {"worker-1", metadata.Worker}} {
		st.Nodes = append(st.Nodes, state.Node{Name: n.name, Role: n.role, IPs: []netip.Addr{addrOf(n.name)}})
	}
	statePath := filepath.Join(t.TempDir(), state.FileName)
	require.NoError(t, state.Write(statePath, st))
	return st, statePath
}

func hasNode(st *state.State, name string) bool {
	for _, n := range st.Nodes {
		if n.Name == name {
			return true
		}
	}
	return false
}

// whenOutputNames runs f once a progress line ("waiting") of out names what, or not at all
// when ctx ends first.
func whenOutputNames(ctx context.Context, out *lockedBuffer, what string, f func()) {
	for {
		for _, l := range strings.Split(out.String(), "\n") {
			if strings.Contains(l, "waiting") && strings.Contains(l, what) {
				f()
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}
