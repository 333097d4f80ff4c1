package nodevolumes

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/openconstellation/constellation/internal/csidriver"
)

// pv is a claimed PersistentVolume of 1Gi named name, for claim default/<claim>, with source
// and the required node affinity terms (none: no affinity).
func pv(name, claim string, source corev1.PersistentVolumeSource, terms ...corev1.NodeSelectorTerm) *corev1.PersistentVolume {
	p := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:               corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			PersistentVolumeSource: source,
			StorageClassName:       "local-path",
		},
	}
	if claim != "" {
		p.Spec.ClaimRef = &corev1.ObjectReference{Namespace: "default", Name: claim}
	}
	if len(terms) > 0 {
		p.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: terms}}
	}
	return p
}

func hostnameIn(nodes ...string) corev1.NodeSelectorTerm {
	return corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: nodes}}}
}

var (
	hostPath = corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/constellation/volumes/pvc-1_default_data-0"}}
	local    = corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: "/mnt/disk"}}
	movable  = corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: csidriver.Name, VolumeHandle: csidriver.IDFor("pvc-9")}}
	otherCSI = corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: "topolvm.io", VolumeHandle: "v1"}}
	nfs      = corev1.PersistentVolumeSource{NFS: &corev1.NFSVolumeSource{Server: "nfs.example", Path: "/export"}}
)

func TestOnNodes(t *testing.T) {
	testCases := map[string]struct {
		pvs   []*corev1.PersistentVolume
		nodes []string
		want  []Volume
	}{
		"local-path volume on a leaving worker": {
			pvs:   []*corev1.PersistentVolume{pv("pvc-1", "data-0", hostPath, hostnameIn("worker-1"))},
			nodes: []string{"worker-1"},
			want:  []Volume{{PV: "pvc-1", Claim: "default/data-0", StorageClass: "local-path", Size: "1Gi", Nodes: []string{"worker-1"}}},
		},
		"local-path volume on a node that stays": {
			pvs:   []*corev1.PersistentVolume{pv("pvc-1", "data-0", hostPath, hostnameIn("worker-0"))},
			nodes: []string{"worker-1"},
		},
		"local volume pinned by the node's name field": {
			pvs: []*corev1.PersistentVolume{pv("pv-local", "db", local, corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{
				{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"worker-1"}},
			}})},
			nodes: []string{"worker-1"},
			want:  []Volume{{PV: "pv-local", Claim: "default/db", StorageClass: "local-path", Size: "1Gi", Nodes: []string{"worker-1"}}},
		},
		"hostPath pinned to two nodes, one leaving: its data may be there": {
			pvs:   []*corev1.PersistentVolume{pv("pvc-1", "data-0", hostPath, hostnameIn("worker-0", "worker-1"))},
			nodes: []string{"worker-1"},
			want:  []Volume{{PV: "pvc-1", Claim: "default/data-0", StorageClass: "local-path", Size: "1Gi", Nodes: []string{"worker-1"}}},
		},
		"hostPath without node affinity: on any node": {
			pvs:   []*corev1.PersistentVolume{pv("pv-host", "scratch", hostPath)},
			nodes: []string{"worker-1"},
			want:  []Volume{{PV: "pv-host", Claim: "default/scratch", StorageClass: "local-path", Size: "1Gi", Unpinned: true}},
		},
		"hostPath pinned by zone only: on any node": {
			pvs: []*corev1.PersistentVolume{pv("pv-zone", "scratch", hostPath, corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{
				{Key: corev1.LabelTopologyZone, Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}},
			}})},
			nodes: []string{"worker-1"},
			want:  []Volume{{PV: "pv-zone", Claim: "default/scratch", StorageClass: "local-path", Size: "1Gi", Unpinned: true}},
		},
		"another driver's volume pinned to the leaving node": {
			pvs:   []*corev1.PersistentVolume{pv("pv-lvm", "logs", otherCSI, hostnameIn("worker-1"))},
			nodes: []string{"worker-1"},
			want:  []Volume{{PV: "pv-lvm", Claim: "default/logs", StorageClass: "local-path", Size: "1Gi", Nodes: []string{"worker-1"}}},
		},
		"another driver's volume reachable from a node that stays": {
			pvs:   []*corev1.PersistentVolume{pv("pv-lvm", "logs", otherCSI, hostnameIn("worker-0", "worker-1"))},
			nodes: []string{"worker-1"},
		},
		"another driver's volume, every node it reaches leaving": {
			pvs:   []*corev1.PersistentVolume{pv("pv-lvm", "logs", otherCSI, hostnameIn("worker-0", "worker-1"))},
			nodes: []string{"worker-1", "worker-0"},
			want:  []Volume{{PV: "pv-lvm", Claim: "default/logs", StorageClass: "local-path", Size: "1Gi", Nodes: []string{"worker-0", "worker-1"}}},
		},
		"a term not pinned to names: not node-local": {
			pvs:   []*corev1.PersistentVolume{pv("pv-lvm", "logs", otherCSI, hostnameIn("worker-1"), corev1.NodeSelectorTerm{})},
			nodes: []string{"worker-1"},
		},
		"the movable driver's volume is never node-local, affinity or not": {
			pvs:   []*corev1.PersistentVolume{pv("pvc-9", "data-9", movable, hostnameIn("worker-1"))},
			nodes: []string{"worker-1"},
		},
		"a network volume outlives its nodes": {
			pvs:   []*corev1.PersistentVolume{pv("pv-nfs", "shared", nfs)},
			nodes: []string{"worker-1"},
		},
		"a volume without a claim holds nobody's data": {
			pvs:   []*corev1.PersistentVolume{pv("pv-free", "", local, hostnameIn("worker-1"))},
			nodes: []string{"worker-1"},
		},
		"no nodes: nothing": {
			pvs: []*corev1.PersistentVolume{pv("pvc-1", "data-0", hostPath, hostnameIn("worker-1"))},
		},
		"sorted by node, then claim": {
			pvs: []*corev1.PersistentVolume{
				pv("pvc-3", "b", hostPath, hostnameIn("worker-2")),
				pv("pvc-2", "b", hostPath, hostnameIn("worker-1")),
				pv("pvc-1", "a", hostPath, hostnameIn("worker-2")),
			},
			nodes: []string{"worker-1", "worker-2"},
			want: []Volume{
				{PV: "pvc-2", Claim: "default/b", StorageClass: "local-path", Size: "1Gi", Nodes: []string{"worker-1"}},
				{PV: "pvc-1", Claim: "default/a", StorageClass: "local-path", Size: "1Gi", Nodes: []string{"worker-2"}},
				{PV: "pvc-3", Claim: "default/b", StorageClass: "local-path", Size: "1Gi", Nodes: []string{"worker-2"}},
			},
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			var objs []runtime.Object
			for _, p := range tc.pvs {
				objs = append(objs, p)
			}
			got, err := OnNodes(t.Context(), fake.NewClientset(objs...), tc.nodes)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestAll(t *testing.T) {
	client := fake.NewClientset(
		pv("pvc-9", "data-9", movable),
		pv("pvc-1", "data-0", hostPath, hostnameIn("worker-1")),
		pv("pv-nfs", "shared", nfs),
		pv("pv-free", "", local, hostnameIn("worker-1")),
	)
	got, err := All(t.Context(), client)
	require.NoError(t, err)
	assert.Equal(t, []Volume{
		{PV: "pvc-1", Claim: "default/data-0", StorageClass: "local-path", Size: "1Gi", Nodes: []string{"worker-1"}},
		{PV: "pvc-9", Claim: "default/data-9", StorageClass: "local-path", Size: "1Gi", Movable: true},
	}, got)
}

// An API that cannot be asked is an error naming the cause, never an empty list: the caller
// refuses on it.
func TestListFailure(t *testing.T) {
	client := fake.NewClientset()
	client.PrependReactor("list", "persistentvolumes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	_, err := OnNodes(context.Background(), client, []string{"worker-1"})
	assert.ErrorContains(t, err, "listing PersistentVolumes: connection refused")
	_, err = All(context.Background(), client)
	assert.ErrorContains(t, err, "connection refused")
}

func TestVolumeText(t *testing.T) {
	v := Volume{PV: "pvc-1", Claim: "default/data-0", StorageClass: "local-path", Size: "1Gi", Nodes: []string{"worker-1"}}
	assert.Equal(t, "default/data-0 (pv pvc-1, 1Gi, local-path)", v.String())
	assert.Equal(t, "on node worker-1", v.Where())
	assert.Equal(t, "default/x (pv p, size not set, no storage class)", Volume{PV: "p", Claim: "default/x"}.String())
	assert.Equal(t, "on one of the nodes a, b", Volume{Nodes: []string{"a", "b"}}.Where())
	assert.Contains(t, Volume{Unpinned: true}.Where(), "whichever node mounted it")
	assert.Contains(t, Volume{Movable: true}.Where(), "movable")
	assert.NotContains(t, Volume{PV: "p\x1b[2J", Claim: "a/b"}.String(), "\x1b", "escaped for the terminal")
}
