package kubeupgrade_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/openconstellation/constellation/internal/cmdutil"
	"github.com/openconstellation/constellation/internal/kube/kubetest"
	"github.com/openconstellation/constellation/internal/kube/kubeupgrade"
	"github.com/openconstellation/constellation/internal/testtier"
)

func TestSkew(t *testing.T) {
	for name, tc := range map[string]struct {
		current, target, wantErr string
	}{
		"same":            {current: "v1.34.4", target: "v1.34.4"},
		"patch":           {current: "v1.34.4", target: "v1.34.5"},
		"next minor":      {current: "v1.34.4", target: "v1.35.0"},
		"two minors":      {current: "v1.34.4", target: "v1.36.0", wantErr: "skips a minor"},
		"next major":      {current: "v1.34.4", target: "v2.0.0", wantErr: "skips a minor"},
		"back":            {current: "v1.35.4", target: "v1.34.4", wantErr: "never goes back"},
		"patch back":      {current: "v1.34.4", target: "v1.34.3", wantErr: "never goes back"},
		"current garbage": {current: "one", target: "v1.34.4", wantErr: `the running version "one" does not parse`},
		"target garbage":  {current: "v1.34.4", target: "", wantErr: `version "" does not parse`},
		// A kubelet's version is what its node reports of itself: the CLI compares each with
		// the release's and prints the error.
		"1 MiB that parses":   {current: "v1.34.4-" + strings.Repeat("x", 1<<20), target: "v1.36.0", wantErr: "skips a minor"},
		"1 MiB that does not": {current: "\x1b[2J" + strings.Repeat("\x1b", 1<<20), target: "v1.35.4", wantErr: `the running version "\x1b[2J`},
	} {
		t.Run(name, func(t *testing.T) {
			err := kubeupgrade.Skew(tc.current, tc.target)
			if tc.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.wantErr)
			assert.Less(t, len(err.Error()), 2048, "bounded")
			assert.NotContains(t, err.Error(), "\x1b")
		})
	}
}

func TestDecide(t *testing.T) {
	allAt := func(v string) map[string]string {
		return map[string]string{"control-plane-1": v, "worker-1": v}
	}
	for name, tc := range map[string]struct {
		own        string
		o          kubeupgrade.Observed
		want       kubeupgrade.Action
		wantReason string
	}{
		"in step": {own: "v1.35.4", o: kubeupgrade.Observed{Cluster: "v1.35.4", KubeProxy: "v1.35.4", Kubelets: allAt("v1.35.4")},
			want: kubeupgrade.None, wantReason: "the cluster and its add-ons run v1.35.4"},
		"first control plane of a new minor": {own: "v1.35.4", o: kubeupgrade.Observed{Cluster: "v1.34.4", KubeProxy: "v1.34.4", Kubelets: allAt("v1.34.4")},
			want: kubeupgrade.ApplyControlPlane},
		"a new patch": {own: "v1.34.5", o: kubeupgrade.Observed{Cluster: "v1.34.4", KubeProxy: "v1.34.4", Kubelets: allAt("v1.34.4")},
			want: kubeupgrade.ApplyControlPlane},
		"two minors ahead: left alone": {own: "v1.36.0", o: kubeupgrade.Observed{Cluster: "v1.34.4", KubeProxy: "v1.34.4"},
			want: kubeupgrade.None, wantReason: "skips a minor"},
		"an old node in an upgraded cluster": {own: "v1.34.4", o: kubeupgrade.Observed{Cluster: "v1.35.4", KubeProxy: "v1.34.4", Kubelets: allAt("v1.34.4")},
			want: kubeupgrade.None, wantReason: "newer than this node's v1.34.4"},
		"add-ons wait for the old nodes": {own: "v1.35.4", o: kubeupgrade.Observed{Cluster: "v1.35.4", KubeProxy: "v1.34.4",
			Kubelets: map[string]string{"control-plane-1": "v1.35.4", "worker-0": "v1.34.4"}},
			want: kubeupgrade.None, wantReason: `not yet: 1 node(s) ["worker-0 (v1.34.4)"]`},
		"add-ons once every node runs the version": {own: "v1.35.4", o: kubeupgrade.Observed{Cluster: "v1.35.4", KubeProxy: "v1.34.4", Kubelets: allAt("v1.35.4")},
			want: kubeupgrade.ApplyAddons},
		"no kube-proxy": {own: "v1.35.4", o: kubeupgrade.Observed{Cluster: "v1.35.4", Kubelets: allAt("v1.34.4")},
			want: kubeupgrade.None},
		"a garbled cluster version": {own: "v1.35.4", o: kubeupgrade.Observed{Cluster: "latest"},
			want: kubeupgrade.None, wantReason: `"latest" does not parse`},
	} {
		t.Run(name, func(t *testing.T) {
			d := kubeupgrade.Decide(tc.own, tc.o)
			assert.Equal(t, tc.want, d.Action, d.Reason)
			assert.Contains(t, d.Reason, tc.wantReason)
		})
	}
}

// recordingKubeadm records the steps and fails them with err.
type recordingKubeadm struct {
	steps []string
	err   error
}

func (r *recordingKubeadm) UpgradeApply(_ context.Context, config []byte, _ io.Writer) error {
	r.steps = append(r.steps, "apply "+string(config))
	return r.err
}

func (r *recordingKubeadm) UpgradeAddons(_ context.Context, config []byte, _ io.Writer) error {
	r.steps = append(r.steps, "addons "+string(config))
	return r.err
}

// objects are what kubeadm leaves at version clusterVersion with kube-proxy at proxy, and
// nodes whose kubelets run the versions of kubelets.
func objects(clusterVersion, proxy string, kubelets map[string]string) (*corev1.ConfigMap, *appsv1.DaemonSet, []*corev1.Node) {
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: kubeupgrade.Namespace, Name: kubeupgrade.KubeadmConfigName},
		Data: map[string]string{kubeupgrade.ClusterConfigKey: "apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\n" +
			"kubernetesVersion: " + clusterVersion + "\nnetworking:\n  serviceSubnet: 10.96.0.0/12\n"},
	}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: kubeupgrade.Namespace, Name: kubeupgrade.KubeProxyName},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"k8s-app": "kube-proxy"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"k8s-app": "kube-proxy"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{
					{Name: kubeupgrade.KubeProxyName, Image: "registry.k8s.io/kube-proxy:" + proxy},
				}},
			},
		},
	}
	var nodes []*corev1.Node
	for name, v := range kubelets {
		nodes = append(nodes, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
			Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{KubeletVersion: v}}})
	}
	return cm, ds, nodes
}

func create(t *testing.T, kube kubernetes.Interface, clusterVersion, proxy string, kubelets map[string]string) {
	t.Helper()
	ctx := context.Background()
	cm, ds, nodes := objects(clusterVersion, proxy, kubelets)
	_, err := kube.CoreV1().ConfigMaps(cm.Namespace).Create(ctx, cm, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = kube.AppsV1().DaemonSets(ds.Namespace).Create(ctx, ds, metav1.CreateOptions{})
	require.NoError(t, err)
	for _, n := range nodes {
		status := n.Status
		created, err := kube.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
		require.NoError(t, err)
		created.Status = status
		_, err = kube.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{})
		require.NoError(t, err)
	}
}

func TestKeeperStep(t *testing.T) {
	for name, tc := range map[string]struct {
		cluster, proxy string
		kubelets       map[string]string
		kubeadmErr     error
		want           []string
		wantErr        string
	}{
		"upgrades the control plane": {cluster: "v1.34.4", proxy: "v1.34.4", kubelets: map[string]string{"cp": "v1.35.4", "w": "v1.34.4"},
			want: []string{"apply config"}},
		"waits with the add-ons": {cluster: "v1.35.4", proxy: "v1.34.4", kubelets: map[string]string{"cp": "v1.35.4", "w": "v1.34.4"}},
		"upgrades the add-ons": {cluster: "v1.35.4", proxy: "v1.34.4", kubelets: map[string]string{"cp": "v1.35.4", "w": "v1.35.4"},
			want: []string{"addons config"}},
		"kubeadm fails": {cluster: "v1.34.4", proxy: "v1.34.4", kubelets: map[string]string{"cp": "v1.35.4"}, kubeadmErr: errors.New("etcd unhealthy"),
			want: []string{"apply config"}, wantErr: "upgrade-control-plane: etcd unhealthy"},
	} {
		t.Run(name, func(t *testing.T) {
			kube := fake.NewClientset()
			create(t, kube, tc.cluster, tc.proxy, tc.kubelets)
			kubeadm := &recordingKubeadm{err: tc.kubeadmErr}
			k := &kubeupgrade.Keeper{Version: "v1.35.4", Kube: kube, Kubeadm: kubeadm, Config: []byte("config"),
				Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
			_, err := k.Step(context.Background())
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
			} else {
				assert.NoError(t, err)
			}
			assert.Equal(t, tc.want, kubeadm.steps)
		})
	}
}

func TestObserveFailures(t *testing.T) {
	ctx := context.Background()
	_, err := kubeupgrade.Observe(ctx, fake.NewClientset())
	assert.ErrorContains(t, err, "reading kube-system/kubeadm-config")

	kube := fake.NewClientset()
	create(t, kube, "latest", "v1.34.4", nil)
	_, err = kubeupgrade.Observe(ctx, kube)
	assert.ErrorContains(t, err, `kubernetesVersion "latest"`)

	// One reading only: kubeadm reads kubernetesVersion exactly and refuses it twice; a
	// second spelling must not make the keeper see another version than kubeadm does.
	for name, tc := range map[string]struct{ version, want string }{
		"in another case": {"v1.34.4\nKubernetesVersion: v1.35.4", "letter case"},
		"twice":           {"v1.34.4\nkubernetesVersion: v1.35.4", "already set in map"},
	} {
		t.Run(name, func(t *testing.T) {
			kube := fake.NewClientset()
			create(t, kube, tc.version, "v1.34.4", nil)
			_, err := kubeupgrade.Observe(ctx, kube)
			assert.ErrorContains(t, err, tc.want)
		})
	}
}

// TestObserveRealAPIServer reads what kubeadm leaves in a real API server, as the keeper of a
// control plane does.
func TestObserveRealAPIServer(t *testing.T) {
	testtier.Integration(t, "etcd and kube-apiserver")
	kube := kubetest.Start(t, kubetest.Options{}).Admin
	create(t, kube, "v1.35.4", "v1.34.4", map[string]string{"control-plane-1": "v1.35.4", "worker-0": "v1.34.4"})
	o, err := kubeupgrade.Observe(context.Background(), kube)
	require.NoError(t, err)
	assert.Equal(t, kubeupgrade.Observed{Cluster: "v1.35.4", KubeProxy: "v1.34.4",
		Kubelets: map[string]string{"control-plane-1": "v1.35.4", "worker-0": "v1.34.4"}}, o)
	d := kubeupgrade.Decide("v1.35.4", o)
	assert.Equal(t, kubeupgrade.None, d.Action)
	assert.Contains(t, d.Reason, "worker-0 (v1.34.4)")

	var out bytes.Buffer
	kubeadm := &recordingKubeadm{}
	k := &kubeupgrade.Keeper{Version: "v1.35.4", Kube: kube, Kubeadm: kubeadm, Config: []byte("config"),
		Log: slog.New(slog.NewTextHandler(&out, nil))}
	node, err := kube.CoreV1().Nodes().Get(context.Background(), "worker-0", metav1.GetOptions{})
	require.NoError(t, err)
	node.Status.NodeInfo.KubeletVersion = "v1.35.4"
	_, err = kube.CoreV1().Nodes().UpdateStatus(context.Background(), node, metav1.UpdateOptions{})
	require.NoError(t, err)
	d, err = k.Step(context.Background())
	require.NoError(t, err)
	assert.Equal(t, kubeupgrade.ApplyAddons, d.Action)
	assert.Equal(t, []string{"addons config"}, kubeadm.steps)
	assert.Contains(t, out.String(), "upgrading kube-proxy and CoreDNS")
}

// Others are versions a replacement must run the images of: only supported ones. A kubelet's
// version is its node's own report; one no release has (a patch we do not build, 1 MiB a
// compromised node wrote) is no version any image can run, and is left out.
func TestOthers(t *testing.T) {
	o := kubeupgrade.Observed{Cluster: "v1.35.4", KubeProxy: "v1.34.4",
		Kubelets: map[string]string{"a": "v1.35.4", "b": "v1.34.4", "c": "v1.34.3", "d": "v1.34.4-" + strings.Repeat("x", 1<<20)}}
	assert.Equal(t, []string{"v1.34.4"}, o.Others("v1.35.4"))
	assert.Equal(t, []string{"v1.35.4"}, o.Others("v1.34.4"))
	assert.Empty(t, kubeupgrade.Observed{Cluster: "v1.35.4"}.Others("v1.35.4"))
}

func TestAddonsAt(t *testing.T) {
	ctx := context.Background()
	coredns := func(tag string, replicas, updated, available, total int32) *appsv1.Deployment {
		return &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Namespace: kubeupgrade.Namespace, Name: kubeupgrade.CoreDNSDeploymentName, Generation: 2},
			Spec: appsv1.DeploymentSpec{Replicas: &replicas, Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				Containers: []corev1.Container{{Name: "coredns", Image: "registry.k8s.io/coredns/coredns:" + tag}}}}},
			Status: appsv1.DeploymentStatus{ObservedGeneration: 2, Replicas: total, UpdatedReplicas: updated, AvailableReplicas: available},
		}
	}
	proxy := func(tag string, desired, updated, available int32) *appsv1.DaemonSet {
		_, ds, _ := objects("v1.35.4", tag, nil)
		ds.Generation = 3
		ds.Status = appsv1.DaemonSetStatus{ObservedGeneration: 3, DesiredNumberScheduled: desired, UpdatedNumberScheduled: updated, NumberAvailable: available}
		return ds
	}
	for name, tc := range map[string]struct {
		ds       *appsv1.DaemonSet
		d        *appsv1.Deployment
		wantDone bool
		want     string
	}{
		"rolled out":          {ds: proxy("v1.35.4", 2, 2, 2), d: coredns("v1.13.1", 2, 2, 2, 2), wantDone: true},
		"none of them":        {wantDone: true},
		"old kube-proxy":      {ds: proxy("v1.34.4", 2, 2, 2), d: coredns("v1.13.1", 2, 2, 2, 2), want: "kube-proxy runs v1.34.4"},
		"kube-proxy rolling":  {ds: proxy("v1.35.4", 2, 1, 2), d: coredns("v1.13.1", 2, 2, 2, 2), want: "kube-proxy v1.35.4 rolling out: 1 of 2 nodes updated"},
		"old CoreDNS":         {ds: proxy("v1.35.4", 2, 2, 2), d: coredns("v1.12.1", 2, 2, 2, 2), want: "CoreDNS runs v1.12.1, not v1.13.1"},
		"an old CoreDNS left": {ds: proxy("v1.35.4", 2, 2, 2), d: coredns("v1.13.1", 2, 2, 2, 3), want: "CoreDNS v1.13.1 rolling out"},
	} {
		t.Run(name, func(t *testing.T) {
			kube := fake.NewClientset()
			if tc.ds != nil {
				_, err := kube.AppsV1().DaemonSets(kubeupgrade.Namespace).Create(ctx, tc.ds, metav1.CreateOptions{})
				require.NoError(t, err)
			}
			if tc.d != nil {
				_, err := kube.AppsV1().Deployments(kubeupgrade.Namespace).Create(ctx, tc.d, metav1.CreateOptions{})
				require.NoError(t, err)
			}
			done, missing, err := kubeupgrade.AddonsAt(ctx, kube, "v1.35.4")
			require.NoError(t, err)
			assert.Equal(t, tc.wantDone, done, missing)
			assert.Contains(t, missing, tc.want)
		})
	}
	_, _, err := kubeupgrade.AddonsAt(ctx, fake.NewClientset(), "v1.20.0")
	assert.ErrorContains(t, err, "not supported")
}

// A node reports its kubelet's version of itself (its Node status): a compromised node can
// put 1 MiB of terminal escapes there. The keeper logs why it waits for the add-ons, naming
// the nodes whose kubelets are older: each line stays bounded and escaped (pkg/untrusted).
func TestKeeperLogsPeerVersionsBounded(t *testing.T) {
	hostile := "v1.34.4-\x1b[2J\x1b]0;pwned\x07\nlevel=ERROR msg=forged" + strings.Repeat("\x1b[31m", (1<<20)/5)
	kube := fake.NewClientset()
	create(t, kube, "v1.35.4", "v1.34.4", map[string]string{"control-plane-1": "v1.35.4", "worker-0": hostile})
	var logs cmdutil.SyncBuffer
	k := &kubeupgrade.Keeper{Version: "v1.35.4", Kube: kube, Kubeadm: &recordingKubeadm{}, Config: []byte("config"),
		Interval: 10 * time.Millisecond, Log: slog.New(slog.NewTextHandler(&logs, nil))}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { k.Run(ctx); close(done) }()
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "worker-0") }, 10*time.Second, 10*time.Millisecond)
	cancel()
	<-done
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		assert.LessOrEqual(t, len(line), 2048, "a log line of %d bytes", len(line))
		assert.NotContains(t, line, "\x1b")
	}
	assert.Contains(t, logs.String(), `…(`, "the version is cut and its length noted")
}
