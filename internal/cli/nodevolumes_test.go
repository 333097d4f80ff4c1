package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/openconstellation/constellation/internal/clusterrecord"
	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/csidriver"
	"github.com/openconstellation/constellation/internal/deploy"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/provider/catalog"
	fakeprovider "github.com/openconstellation/constellation/internal/provider/fake"
	"github.com/openconstellation/constellation/internal/provider/local"
	"github.com/openconstellation/constellation/internal/release"
	"github.com/openconstellation/constellation/internal/release/releasedir"
	"github.com/openconstellation/constellation/internal/state"
	"github.com/openconstellation/constellation/internal/testnet"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
)

// localPathPV is the PersistentVolume local-path-provisioner makes for claim default/<claim>:
// a hostPath directory of node, pinned to it by node affinity.
func localPathPV(name, claim, node string) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{
				Path: "/var/lib/constellation/volumes/" + name + "_default_" + claim,
			}},
			ClaimRef:         &corev1.ObjectReference{Namespace: "default", Name: claim},
			StorageClassName: "local-path",
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
			}}}},
		},
		Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeBound},
	}
}

// movablePV is a volume of the cluster's own driver, last attached to node (the affinity a
// topology-aware provisioner could still write must not make it node-local).
func movablePV(name, claim, node string) *corev1.PersistentVolume {
	pv := localPathPV(name, claim, node)
	pv.Spec.HostPath = nil
	pv.Spec.CSI = &corev1.CSIPersistentVolumeSource{Driver: csidriver.Name, VolumeHandle: csidriver.IDFor(name)}
	pv.Spec.StorageClassName = "encrypted"
	return pv
}

// imagedPlatform is machinesPlatform whose machines boot the images named (an upgrade's view).
type imagedPlatform struct {
	*machinesPlatform
	images map[string]string
}

func (p *imagedPlatform) Nodes(ctx context.Context) ([]provider.Node, error) {
	nodes, err := p.machinesPlatform.Nodes(ctx)
	for i := range nodes {
		nodes[i].Image = p.images[nodes[i].Name]
	}
	return nodes, err
}

// volumeCluster is an initialized cluster of control-plane-0, worker-0 and worker-1 as apply
// sees it: the state file, the platform's machines, and an API server (the fake clientset)
// where every node is Ready and verifiable, holding pvs.
type volumeCluster struct {
	st        *state.State
	statePath string
	platform  *machinesPlatform
	client    *fake.Clientset
	out       *lockedBuffer
}

func newVolumeCluster(t *testing.T, pvs ...*corev1.PersistentVolume) *volumeCluster {
	t.Helper()
	st, statePath := removalState(t)
	c := &volumeCluster{st: st, statePath: statePath, out: &lockedBuffer{},
		platform: &machinesPlatform{machines: map[string]metadata.Role{"control-plane-0": metadata.ControlPlane, "worker-0": metadata.Worker, "worker-1": metadata.Worker}}}
	c.client = fake.NewClientset()
	filterPodsByNode(c.client)
	ctx := t.Context()
	for _, n := range st.Nodes {
		_, err := c.client.CoreV1().Nodes().Create(ctx, &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: n.Name},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
				NodeInfo: corev1.NodeSystemInfo{KubeletVersion: config.DefaultKubernetesVersion}},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
		_, err = c.client.CoreV1().Pods(clusterrecord.Namespace).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "verify-" + n.Name, Namespace: clusterrecord.Namespace,
				Labels: map[string]string{"app.kubernetes.io/name": deploy.VerificationService},
				// A DaemonSet's pod, as deploy runs it: drain leaves it.
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: deploy.VerificationService, UID: "ds", Controller: ptr.To(true)}}},
			Spec:   corev1.PodSpec{NodeName: n.Name},
			Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	for _, pv := range pvs {
		_, err := c.client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	return c
}

// filterPodsByNode makes the fake clientset honour a pod list's spec.nodeName field selector,
// as the API server does (drain lists a node's pods so).
func filterPodsByNode(client *fake.Clientset) {
	client.PrependReactor("list", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		sel := a.(k8stesting.ListAction).GetListRestrictions().Fields
		if sel == nil || sel.Empty() {
			return false, nil, nil
		}
		obj, err := client.Tracker().List(schema.GroupVersionResource{Version: "v1", Resource: "pods"}, schema.GroupVersionKind{Version: "v1", Kind: "Pod"}, a.GetNamespace())
		if err != nil {
			return true, nil, err
		}
		list := obj.(*corev1.PodList)
		var keep []corev1.Pod
		for _, p := range list.Items {
			if sel.Matches(fields.Set{"spec.nodeName": p.Spec.NodeName}) {
				keep = append(keep, p)
			}
		}
		list.Items = keep
		return true, list, nil
	})
}

// apply runs what `constellation apply` runs on an initialized cluster's nodes
// (upgrade.reconcileNodes) with the configuration's counts, image and release, and o.
func (c *volumeCluster) apply(t *testing.T, workers int, image string, rel *releasedir.Release, platform provider.Provider, o scaleOptions) error {
	t.Helper()
	conf := config.Default()
	conf.Name = "demo"
	conf.Provider = config.ProviderFor(state.ProviderLocal, config.ProviderBlock{ControlPlanes: 1, Workers: workers})
	o.drainTimeout = 10 * time.Second
	tm := newPhaseTimer(c.out)
	r := &reconciler{out: c.out, t: tm, prog: newProgress(tm), client: c.client, platform: platform,
		st: c.st, statePath: c.statePath, o: o, revokeWait: 100 * time.Millisecond}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	stop := r.prog.start(ctx)
	defer stop()
	u := &upgrade{reconciler: r, workspace: t.TempDir(), conf: conf, image: image, release: rel}
	err := u.reconcileNodes(ctx)
	t.Logf("apply:\n%s", c.out)
	return err
}

// assertKept asserts that node is untouched: in the state file, its machine and Node there,
// not cordoned.
func (c *volumeCluster) assertKept(t *testing.T, node string) {
	t.Helper()
	assert.True(t, hasNode(c.st, node), "%s is still in the state file", node)
	loaded, err := state.Load(c.statePath)
	require.NoError(t, err)
	assert.True(t, hasNode(loaded, node), "%s is still in the state file on disk", node)
	assert.Contains(t, c.platform.machines, node, "%s's machine is still there", node)
	assert.Empty(t, c.platform.deleted, "no machine was deleted")
	assert.Empty(t, c.platform.created, "no machine was created")
	n, err := c.client.CoreV1().Nodes().Get(t.Context(), node, metav1.GetOptions{})
	if assert.NoError(t, err, "%s's Node is still there", node) {
		assert.False(t, n.Spec.Unschedulable, "%s was not cordoned", node)
	}
}

// assertRemoved asserts that apply removed node.
func (c *volumeCluster) assertRemoved(t *testing.T, node string) {
	t.Helper()
	assert.False(t, hasNode(c.st, node), "%s is no longer in the state file", node)
	assert.NotContains(t, c.platform.machines, node, "%s's machine is deleted", node)
}

const destroyLine = "would destroy node-local volume default/data-0 (pv pvc-1, 1Gi, local-path) on node "

// A scale-down that would remove the worker holding a local-path volume (a directory in that
// worker's state storage, deleted with it) is refused before anything changes, naming the
// volume and the flag that accepts its loss; with the flag it goes ahead and says what it
// destroys. Before the fix, apply removed the worker and the volume silently.
func TestScaleDownRefusesToDestroyNodeLocalVolumes(t *testing.T) {
	for _, accept := range []bool{false, true} {
		t.Run(map[bool]string{false: "refused", true: "accepted with the flag"}[accept], func(t *testing.T) {
			c := newVolumeCluster(t, localPathPV("pvc-1", "data-0", "worker-1"))
			err := c.apply(t, 1, "", nil, c.platform, scaleOptions{deleteNodeLocalVolumes: accept})
			assert.Contains(t, c.out.String(), destroyLine+"worker-1")
			if !accept {
				require.Error(t, err)
				assert.ErrorContains(t, err, "--delete-node-local-volumes")
				assert.ErrorContains(t, err, "default/data-0")
				c.assertKept(t, "worker-1")
				return
			}
			require.NoError(t, err)
			c.assertRemoved(t, "worker-1")
		})
	}
}

// apply --remove of the node holding the volume: the same refusal; --remove of another node
// is not refused (the volume stays with its node).
func TestRemoveRefusesToDestroyNodeLocalVolumes(t *testing.T) {
	testCases := map[string]struct {
		remove      string
		accept      bool
		wantRefused bool
	}{
		"the node holding the volume: refused":          {remove: "worker-0", wantRefused: true},
		"the node holding the volume, with the flag":    {remove: "worker-0", accept: true},
		"another node: the volume stays, nothing asked": {remove: "worker-1"},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			c := newVolumeCluster(t, localPathPV("pvc-1", "data-0", "worker-0"))
			err := c.apply(t, 1, "", nil, c.platform, scaleOptions{remove: []string{tc.remove}, deleteNodeLocalVolumes: tc.accept})
			if tc.wantRefused {
				require.Error(t, err)
				assert.ErrorContains(t, err, "--delete-node-local-volumes")
				assert.Contains(t, c.out.String(), destroyLine+"worker-0")
				c.assertKept(t, "worker-0")
				return
			}
			require.NoError(t, err)
			c.assertRemoved(t, tc.remove)
			if tc.remove != "worker-0" {
				assert.NotContains(t, c.out.String(), "would destroy", "a volume on a node that stays is not named")
			}
		})
	}
}

// A volume of the movable driver lives outside every node: a scale-down neither names nor
// refuses it.
func TestScaleDownKeepsMovableVolumes(t *testing.T) {
	c := newVolumeCluster(t, movablePV("pvc-9", "data-9", "worker-1"))
	require.NoError(t, c.apply(t, 1, "", nil, c.platform, scaleOptions{}))
	assert.NotContains(t, c.out.String(), "data-9")
	c.assertRemoved(t, "worker-1")
}

// When apply cannot tell which volumes a node holds (the API refuses or cannot be reached),
// it refuses, with the cause, before anything changes (fail closed); the flag accepts losing
// whatever they hold.
func TestScaleDownFailsClosedWhenVolumesCannotBeListed(t *testing.T) {
	for _, accept := range []bool{false, true} {
		t.Run(map[bool]string{false: "refused", true: "accepted with the flag"}[accept], func(t *testing.T) {
			c := newVolumeCluster(t, localPathPV("pvc-1", "data-0", "worker-1"))
			c.client.PrependReactor("list", "persistentvolumes", func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "persistentvolumes"}, "", errors.New("RBAC says no"))
			})
			err := c.apply(t, 1, "", nil, c.platform, scaleOptions{deleteNodeLocalVolumes: accept})
			if !accept {
				require.Error(t, err)
				assert.ErrorContains(t, err, "RBAC says no", "the cause")
				assert.ErrorContains(t, err, "--delete-node-local-volumes")
				c.assertKept(t, "worker-1")
				return
			}
			require.NoError(t, err)
			assert.Contains(t, c.out.String(), "RBAC says no", "the flag's acceptance says what was not checked")
			c.assertRemoved(t, "worker-1")
		})
	}
}

// An upgrade roll replaces every node booting another image; before it replaces the first,
// it checks every node it will replace, and refuses when one holds a node-local volume.
func TestUpgradeRollRefusesToDestroyNodeLocalVolumes(t *testing.T) {
	b := newReleaseBench(t)
	dir := b.publish("v0.2.0", b.base)
	rel, err := releasedir.Open(t.Context(), dir, b.key.Public(), release.Policy{}, local.ImageDigest)
	require.NoError(t, err)

	c := newVolumeCluster(t, localPathPV("pvc-1", "data-0", "worker-1"))
	// control-plane-0 and worker-0 boot the release already (an upgrade under way, so the
	// health check of a fresh start does not apply); worker-1 is still to be replaced.
	platform := &imagedPlatform{machinesPlatform: c.platform, images: map[string]string{
		"control-plane-0": rel.NodeImage(), "worker-0": rel.NodeImage(), "worker-1": b.base,
	}}
	err = c.apply(t, 2, rel.NodeImage(), rel, platform, scaleOptions{})
	require.Error(t, err)
	assert.ErrorContains(t, err, "--delete-node-local-volumes")
	assert.Contains(t, c.out.String(), destroyLine+"worker-1")
	c.assertKept(t, "worker-1")
	assert.NotContains(t, c.out.String(), "creating", "no replacement was created")
}

// fakeCluster is a workspace with a cluster of the fake provider (runs nothing) whose admin
// kubeconfig points at an API server holding pvs.
func fakeCluster(t *testing.T, pvs ...*corev1.PersistentVolume) string {
	t.Helper()
	platform := fakeprovider.New()
	catalog.Register(platform)
	ws := t.TempDir()
	reference, err := platform.ReferenceValues("image-a")
	require.NoError(t, err)
	conf := config.Default()
	conf.Name = "fake-cluster"
	conf.Provider = config.ProviderFor(fakeprovider.Name, config.ProviderBlock{ControlPlanes: 1, Workers: 2, Image: "image-a"})
	conf.Attestation = config.AttestationFor(fakeprovider.Variant, config.VariantConfig{Measurements: measurements.ReferenceSets{{Name: "fake", Measurements: reference.Measurements}}})
	require.NoError(t, config.Write(filepath.Join(ws, config.FileName), conf, false))
	_, err = createOn(t.Context(), newPhaseTimer(io.Discard), filepath.Join(ws, state.FileName), platform, ws, conf, createOptions{})
	require.NoError(t, err)

	list := corev1.PersistentVolumeList{TypeMeta: metav1.TypeMeta{Kind: "PersistentVolumeList", APIVersion: "v1"}}
	for _, pv := range pvs {
		list.Items = append(list.Items, *pv)
	}
	body, err := json.Marshal(list)
	require.NoError(t, err)
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/persistentvolumes" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	}))
	t.Cleanup(api.Close)
	writeAdminConf(t, ws, api.URL)
	return ws
}

func writeAdminConf(t *testing.T, ws, server string) {
	t.Helper()
	kubeconfig := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: %s\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\nusers:\n- name: u\n  user: {}\ncurrent-context: c\n", server)
	require.NoError(t, os.WriteFile(filepath.Join(ws, AdminConfFile), []byte(kubeconfig), 0o600))
}

// terminate destroys every volume with the cluster: the node-local ones, and on the local
// provider the movable ones too (their files are in the workspace's folder it removes). Its
// refusal without --yes names them, and with --yes, which asks nothing, it prints them before
// it removes anything. Before the fix, terminate named no volume.
func TestTerminateNamesTheVolumesItDestroys(t *testing.T) {
	ws := fakeCluster(t, localPathPV("pvc-1", "data-0", "worker-1"), movablePV("pvc-9", "data-9", "worker-0"))

	out, err := run(t, "-C", ws, "terminate")
	require.Error(t, err)
	assert.ErrorContains(t, err, "--yes")
	assert.ErrorContains(t, err, "default/data-0 (pv pvc-1, 1Gi, local-path) on node worker-1")
	assert.ErrorContains(t, err, "default/data-9 (pv pvc-9, 1Gi, encrypted)")
	_, statErr := os.Stat(filepath.Join(ws, state.FileName))
	assert.NoError(t, statErr, "nothing was removed\n%s", out)

	out, err = run(t, "-C", ws, "terminate", "--yes")
	t.Logf("terminate --yes:\n%s", out)
	require.NoError(t, err, out)
	assert.Contains(t, out, "destroys node-local volume default/data-0 (pv pvc-1, 1Gi, local-path) on node worker-1")
	assert.Contains(t, out, "destroys volume default/data-9 (pv pvc-9, 1Gi, encrypted)")
	assert.Less(t, strings.Index(out, "data-0"), strings.Index(out, "removed the cluster"), "named before the cluster is removed")
	_, statErr = os.Stat(filepath.Join(ws, state.FileName))
	assert.ErrorIs(t, statErr, os.ErrNotExist)
}

// A cluster whose API does not answer is terminated with --yes all the same (terminate is
// how a broken cluster is removed), saying that its volumes could not be listed and are
// destroyed; without --yes the refusal says so too.
func TestTerminateWithoutAnAPI(t *testing.T) {
	ws := fakeCluster(t)
	writeAdminConf(t, ws, "https://"+testnet.Addr(t))
	_, err := run(t, "-C", ws, "terminate")
	require.Error(t, err)
	assert.ErrorContains(t, err, "--yes")
	assert.ErrorContains(t, err, "cannot list the cluster's volumes")
	out, err := run(t, "-C", ws, "terminate", "--yes")
	require.NoError(t, err, out)
	assert.Contains(t, out, "cannot list the cluster's volumes")
	assert.Contains(t, out, "removed the cluster")
}
