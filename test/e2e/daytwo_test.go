package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/nodeimage"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/provider/local/cluster"
	"github.com/openconstellation/constellation/internal/state"
	"github.com/openconstellation/constellation/internal/statedisk"
	"github.com/openconstellation/constellation/internal/testnet"
	"github.com/openconstellation/constellation/internal/volumes"
)

// statusJSON is what the tests read of `constellation status -o json`.
type statusJSON struct {
	Cluster  struct{ Name, Phase, ClusterID string }
	Nodes    []nodeJSON
	Removed  []struct{ Name, Admission string }
	Services []struct {
		Name           string
		Desired, Ready int
	}
	Errors []string
}

type nodeJSON struct {
	Name     string
	Role     string
	Provider *struct {
		State, Reported, Detail string
		ReportedDetail          string
		Boots                   int
		Events                  []struct{ Message string }
	}
	Kubernetes *struct {
		Registered, Ready bool
		Version           string
	}
	Attestation *struct {
		Verified     bool
		ReferenceSet string
		Error        string
	}
}

func (s statusJSON) node(name string) (int, bool) {
	i := slices.IndexFunc(s.Nodes, func(n nodeJSON) bool { return n.Name == name })
	return i, i >= 0
}

// dayTwo is a running cluster of the day-two tests.
type dayTwo struct {
	t          *testing.T
	bin, ws    string
	kubeconfig string
}

// on is d for subtest t (assertions must fail the test running them).
func (d *dayTwo) on(t *testing.T) *dayTwo {
	c := *d
	c.t = t
	return &c
}

func (d *dayTwo) run(args ...string) string {
	d.t.Helper()
	out, err := exec.Command(d.bin, append(args, "-C", d.ws)...).CombinedOutput()
	require.NoError(d.t, err, "constellation %s: %s", strings.Join(args, " "), out)
	return string(out)
}

func (d *dayTwo) status() statusJSON {
	d.t.Helper()
	var s statusJSON
	out := d.run("status", "-o", "json")
	require.NoError(d.t, json.Unmarshal([]byte(out), &s), "%s", out)
	return s
}

// problems lists why status s is not a healthy cluster of exactly names: every node
// running, Ready and verified, every service's pods ready on every node it should run on.
func (s statusJSON) problems(names ...string) []string {
	var out, got []string
	for _, n := range s.Nodes {
		got = append(got, n.Name)
		switch {
		case n.Provider == nil:
			out = append(out, n.Name+": no platform view")
		case n.Provider.State != "running":
			out = append(out, n.Name+": "+n.Provider.State)
		}
		switch {
		case n.Kubernetes == nil:
			out = append(out, n.Name+": no Kubernetes view")
		case !n.Kubernetes.Ready:
			out = append(out, n.Name+": not Ready")
		}
		switch {
		case n.Attestation == nil:
			out = append(out, n.Name+": no attestation view")
		case !n.Attestation.Verified:
			out = append(out, n.Name+": not verified: "+n.Attestation.Error)
		}
	}
	slices.Sort(got)
	want := slices.Clone(names)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		out = append(out, fmt.Sprintf("nodes %v, want %v", got, want))
	}
	if len(s.Services) != 3 {
		out = append(out, fmt.Sprintf("services: %v", s.Services))
	}
	for _, svc := range s.Services {
		if svc.Ready == 0 || svc.Desired != svc.Ready {
			out = append(out, fmt.Sprintf("%s: %d of %d ready", svc.Name, svc.Ready, svc.Desired))
		}
	}
	return append(out, s.Errors...)
}

// requireHealthy waits (polled, 2 minutes at most) until status shows a healthy cluster of
// exactly names, and fails naming what is not. Status converges: a DaemonSet's counts follow
// a node's addition or removal, a rebooted node's pods start again.
func (d *dayTwo) requireHealthy(names ...string) statusJSON {
	d.t.Helper()
	var s statusJSON
	var problems []string
	deadline := time.Now().Add(2 * time.Minute)
	for {
		s = d.status()
		if problems = s.problems(names...); len(problems) == 0 {
			return s
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("the cluster is not healthy: %s", strings.Join(problems, "; "))
		}
		time.Sleep(2 * time.Second)
	}
}

// setCounts edits the workspace's configuration's node counts, as a user does.
func (d *dayTwo) setCounts(controlPlanes, workers int) {
	d.t.Helper()
	setCounts(d.t, d.ws, controlPlanes, workers)
}

func setCounts(t testing.TB, ws string, controlPlanes, workers int) {
	t.Helper()
	path := filepath.Join(ws, config.FileName)
	conf, err := config.Load(path)
	require.NoError(t, err)
	conf.Provider.Block().ControlPlanes, conf.Provider.Block().Workers = controlPlanes, workers
	require.NoError(t, config.Write(path, conf, true))
}

// TestDayTwo runs one local cluster through its second day: a workload and a ConfigMap,
// reboots (a worker), a killed bootstrapper (the provider's watchdog), scaling workers
// 2 → 3 → 1 and control planes 1 → 3 → 1, a removed node that cannot come back, a reboot of
// the only control plane (recovered by `constellation recover`), a full stop, start and
// recover with the data intact, and `status -o json` at every step; no leftovers after.
func TestDayTwo(t *testing.T) {
	if testing.Short() {
		t.Skip("creates a local cluster")
	}
	bin, _ := buildBinaries(t)
	ws := t.TempDir()
	images := filepath.Join(repoOutput(t), "images")
	d := &dayTwo{t: t, bin: bin, ws: ws, kubeconfig: filepath.Join(ws, "constellation-admin.conf")}
	out := miniUp(t, bin, ws, "--workers", "2")
	t.Logf("mini up:\n%s", phases(out))
	d.requireHealthy("control-plane-0", "worker-0", "worker-1")
	// apply copied every node's disk from the cluster's disk-owner records into the state
	// file: recover sends a control plane only the key of that disk.
	st, err := state.Load(filepath.Join(ws, state.FileName))
	require.NoError(t, err)
	for _, n := range st.Nodes {
		id, err := (&statedisk.Gocryptfs{Dir: filepath.Join(ws, "mini", "nodes", n.Name, "state")}).UUID()
		require.NoError(t, err)
		assert.Equal(t, id, n.Disk, "%s: the disk recorded in the state file", n.Name)
	}

	// A workload on worker-0 and a ConfigMap: both must survive everything below.
	helloPod(t, d.kubeconfig, images, "worker-0")
	kubectl(t, d.kubeconfig, "create", "configmap", "survivor", "--from-literal=written=before")

	// An image the user built, loaded into the running nodes: a pod of it runs on worker-0
	// and must run again after worker-0's reboot, and a node added later runs it too.
	loaded := userImage(t, images)
	out = []byte(d.run("image", "load", loaded))
	t.Logf("image load:\n%s", out)
	assert.Contains(t, string(out), "stored "+userImageRef)
	assert.Contains(t, string(out), "OK    worker-0: 1 image(s) imported")
	// It runs as a StatefulSet of a user that is not root, with a volume of the node-local
	// StorageClass local-path (in worker-0's encrypted state storage) that must keep its data
	// across the reboot.
	loadedStatefulSet(t, d.kubeconfig, "loaded-on-worker-0", "worker-0")
	// kubectl port-forward with the admin kubeconfig reaches it from the host, and so do a
	// LoadBalancer Service's address and its node port on the host's loopback.
	requirePortForward(t, d.kubeconfig, "pod/loaded-on-worker-0-0", 8080)
	lbAddr, nodePortAddr := loadBalancerService(t, d.kubeconfig, "loaded-on-worker-0")
	const stored = "written before the reboot"
	putData(t, lbAddr, stored)
	pv := kubectl(t, d.kubeconfig, "get", "pvc", "data-loaded-on-worker-0-0", "-o", "jsonpath={.spec.volumeName}")
	assert.Contains(t, kubectl(t, d.kubeconfig, "get", "pv", pv, "-o", "jsonpath={.spec.hostPath.path}"), volumes.Dir+"/",
		"the volume is a directory of the node's state storage")

	// The README's application with a volume of the default StorageClass (encrypted, movable),
	// on worker-1: the scale-down below removes worker-1, and the pod must start on
	// worker-0 with its data.
	app := deployVolumeApp(t, d.kubeconfig, images, "app", "", "worker-1")
	const appData = "kept by a volume that moves with its pod"
	app.put(appData)
	appNode := app.node()
	t.Logf("the application runs on %s", appNode)
	requireMovableVolume(t, d.kubeconfig, ws, "app-data", appNode, appData)

	t.Run("reboot a worker", func(t *testing.T) {
		d := d.on(t)
		out := d.run("reboot", "worker-0")
		t.Logf("%s", out)
		assert.Contains(t, out, "worker-0 (Ready by a fresh kubelet heartbeat, verification service up)")
		s := d.requireHealthy("control-plane-0", "worker-0", "worker-1")
		i, _ := s.node("worker-0")
		assert.Equal(t, 2, s.Nodes[i].Provider.Boots)
		assert.Equal(t, "rejoined", s.Nodes[i].Provider.Reported)
		kubectl(t, d.kubeconfig, "wait", "--for=condition=Ready", "pod/hello-server", "--timeout=120s")
		kubectl(t, d.kubeconfig, "wait", "--for=condition=Ready", "pod/loaded-on-worker-0-0", "--timeout=120s")
		requireAnswers(t, lbAddr)
		requireAnswers(t, nodePortAddr)
		assert.Equal(t, stored, getData(t, lbAddr), "the volume kept its data across the reboot")
		assert.Equal(t, "before", kubectl(t, d.kubeconfig, "get", "configmap", "survivor", "-o", "jsonpath={.data.written}"))
	})

	t.Run("a killed bootstrapper: the provider reboots the node", func(t *testing.T) {
		d := d.on(t)
		pid := bootstrapperPID(t, ws, "worker-1")
		require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
		var s statusJSON
		require.Eventually(t, func() bool {
			s = d.status()
			i, ok := s.node("worker-1")
			return ok && s.Nodes[i].Provider != nil && s.Nodes[i].Provider.Boots == 2 && s.Nodes[i].Provider.Reported == "rejoined" &&
				s.Nodes[i].Kubernetes != nil && s.Nodes[i].Kubernetes.Ready
		}, 2*time.Minute, time.Second, "worker-1 is rebooted by the watchdog and rejoins")
		i, _ := s.node("worker-1")
		var events []string
		for _, e := range s.Nodes[i].Provider.Events {
			events = append(events, e.Message)
		}
		assert.True(t, slices.ContainsFunc(events, func(e string) bool {
			return strings.Contains(e, "bootstrapper exited") && strings.Contains(e, "rebooting")
		}), "events: %v", events)
		d.requireHealthy("control-plane-0", "worker-0", "worker-1")
	})

	t.Run("scale workers 2 to 3 to 1", func(t *testing.T) {
		d := d.on(t)
		d.setCounts(1, 3)
		out := d.run("apply")
		t.Logf("%s", out)
		assert.Contains(t, out, "+ worker-2")
		d.requireHealthy("control-plane-0", "worker-0", "worker-1", "worker-2")
		// A node created after the load imports the loaded images at its boot.
		loadedPod(t, d.kubeconfig, "loaded-on-worker-2", "worker-2")
		kubectl(t, d.kubeconfig, "delete", "pod", "loaded-on-worker-2", "--wait=false")

		// A pod on worker-2: the drain evicts it through the Eviction API.
		applyManifest(t, d.kubeconfig, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: evictee, namespace: default}
spec:
  nodeName: worker-2
  terminationGracePeriodSeconds: 1
  containers: [{name: hello, image: %s, imagePullPolicy: Never}]
`, helloRef(t, images)))
		kubectl(t, d.kubeconfig, "wait", "--for=condition=Ready", "pod/evictee", "--timeout=120s")

		// A volume of the node-local class on worker-2: removing worker-2 destroys it, so
		// apply refuses until the user accepts that by name, and changes nothing before.
		applyManifest(t, d.kubeconfig, fmt.Sprintf(`apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: local-data, namespace: default}
spec: {storageClassName: local-path, accessModes: [ReadWriteOnce], resources: {requests: {storage: 10Mi}}}
---
apiVersion: v1
kind: Pod
metadata: {name: local-data, namespace: default}
spec:
  nodeSelector: {kubernetes.io/hostname: worker-2}
  terminationGracePeriodSeconds: 1
  containers: [{name: hello, image: %s, imagePullPolicy: Never, volumeMounts: [{name: data, mountPath: /data}]}]
  volumes: [{name: data, persistentVolumeClaim: {claimName: local-data}}]
`, helloRef(t, images)))
		kubectl(t, d.kubeconfig, "wait", "--for=condition=Ready", "pod/local-data", "--timeout=120s")

		// Root on worker-1 keeps its kubelet's credential: once apply has removed the node,
		// that credential can write nothing, at once.
		stolen := kubeletCredential(t, ws, "worker-1")
		d.setCounts(1, 1)
		refused, err := exec.Command(d.bin, "apply", "-C", d.ws).CombinedOutput()
		t.Logf("%s", refused)
		require.Error(t, err, "apply must refuse to destroy a node-local volume unasked")
		assert.Contains(t, string(refused), "default/local-data")
		assert.Contains(t, string(refused), "--delete-node-local-volumes")
		assert.NotContains(t, string(refused), "app-data", "the movable volume is not named: it moves")
		assert.Contains(t, kubectl(t, d.kubeconfig, "get", "nodes"), "worker-2", "a refused apply removes nothing")
		out = d.run("apply", "--delete-node-local-volumes")
		t.Logf("%s", out)
		assert.Contains(t, out, "- worker-2")
		assert.Contains(t, out, "- worker-1")
		assertRevoked(t, stolen.client(t, d.kubeconfig), "worker-1")
		assert.Contains(t, out, "worker-2: evicted default/evictee")
		s := d.requireHealthy("control-plane-0", "worker-0")
		var removed []string
		for _, r := range s.Removed {
			removed = append(removed, r.Name)
		}
		assert.ElementsMatch(t, []string{"worker-1", "worker-2"}, removed)
		assert.NotContains(t, kubectl(t, d.kubeconfig, "get", "nodes"), "worker-1")
		st, err := state.Load(filepath.Join(ws, state.FileName))
		require.NoError(t, err)
		assert.Len(t, st.Nodes, 2)
		_, err = os.Stat(filepath.Join(ws, "mini", "nodes", "worker-1"))
		assert.True(t, os.IsNotExist(err), "the removed node's disk is gone")
		kubectl(t, d.kubeconfig, "wait", "--for=condition=Ready", "pod/hello-server", "--timeout=60s")

		// The movable volume went with its pod to worker-0, data and all.
		app.requireData(appData)
		assert.Equal(t, "worker-0", app.node(), "the application's pod moved to the remaining worker")
		requireMovableVolume(t, d.kubeconfig, ws, "app-data", "worker-0", appData)
	})

	t.Run("a removed node cannot come back", func(t *testing.T) {
		d := d.on(t)
		// The platform lists the removed name again (a re-created machine): the join
		// service refuses it, by the record apply wrote when it removed the node.
		platform := &cluster.Local{Dir: filepath.Join(ws, "mini"), Exe: bin}
		_, err := platform.CreateNodes(t.Context(), []provider.NodeSpec{{Name: "worker-1", Role: metadata.Worker, Image: filepath.Join(ws, "mini", "image")}})
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			logs := kubectl(t, d.kubeconfig, "-n", "kube-system", "logs", "-l", "app.kubernetes.io/name=constellation-join-service", "--tail=-1")
			return strings.Contains(logs, `"node":"worker-1"`) && strings.Contains(logs, `"reason":"removed-node"`)
		}, 2*time.Minute, time.Second, "the join service refuses the removed node")
		assert.NotContains(t, readyNodes(t, d.kubeconfig), "worker-1")
		require.NoError(t, platform.DeleteNode(t.Context(), "worker-1"))
	})

	t.Run("scale control planes 1 to 3 to 1", func(t *testing.T) {
		d := d.on(t)
		d.setCounts(3, 1)
		out := d.run("apply")
		t.Logf("%s", out)
		assert.Contains(t, out, "+ control-plane-1")
		assert.Contains(t, out, "+ control-plane-2")
		d.requireHealthy("control-plane-0", "control-plane-1", "control-plane-2", "worker-0")
		assert.Len(t, etcdMembers(t, d.kubeconfig), 3)

		d.setCounts(1, 1)
		out = d.run("apply")
		t.Logf("%s", out)
		assert.Contains(t, out, "- control-plane-2")
		d.requireHealthy("control-plane-0", "worker-0")
		assert.Len(t, etcdMembers(t, d.kubeconfig), 1)
		assert.Equal(t, "before", kubectl(t, d.kubeconfig, "get", "configmap", "survivor", "-o", "jsonpath={.data.written}"))
	})

	t.Run("reboot the only control plane, recover it", func(t *testing.T) {
		d := d.on(t)
		out := d.run("reboot", "--no-wait", "control-plane-0")
		t.Logf("%s", out)
		require.Eventually(t, func() bool {
			s := d.status()
			i, ok := s.node("control-plane-0")
			return ok && s.Nodes[i].Provider != nil && s.Nodes[i].Provider.Reported == "waiting-for-recovery"
		}, 2*time.Minute, time.Second, "the control plane finds no join service and waits for recovery")
		out = d.run("recover")
		t.Logf("%s", out)
		d.requireHealthy("control-plane-0", "worker-0")
		assert.Equal(t, "before", kubectl(t, d.kubeconfig, "get", "configmap", "survivor", "-o", "jsonpath={.data.written}"))
	})

	t.Run("stop, start, recover", func(t *testing.T) {
		d := d.on(t)
		kubectl(t, d.kubeconfig, "create", "configmap", "before-stop", "--from-literal=k=v")
		d.run("stop")
		s := d.status()
		for _, n := range s.Nodes {
			assert.Equal(t, "stopped", n.Provider.State, n.Name)
		}
		assert.Empty(t, processesMentioning(t, filepath.Join(ws, "mini", "nodes")), "no node process runs while stopped")
		d.run("start")
		require.Eventually(t, func() bool {
			s := d.status()
			i, ok := s.node("control-plane-0")
			return ok && s.Nodes[i].Provider != nil && s.Nodes[i].Provider.Reported == "waiting-for-recovery"
		}, 2*time.Minute, time.Second, "the control plane waits for recovery")
		out := d.run("recover")
		t.Logf("%s", out)
		d.requireHealthy("control-plane-0", "worker-0")
		assert.Equal(t, "v", kubectl(t, d.kubeconfig, "get", "configmap", "before-stop", "-o", "jsonpath={.data.k}"))
		kubectl(t, d.kubeconfig, "wait", "--for=condition=Ready", "pod/hello-server", "--timeout=120s")
	})
}

// bootstrapperPID finds the bootstrapper process of node in the cluster of ws.
func bootstrapperPID(t *testing.T, ws, node string) int {
	t.Helper()
	want := filepath.Join(ws, "mini", "nodes", node)
	entries, err := os.ReadDir("/proc")
	require.NoError(t, err)
	for _, e := range entries {
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if len(args) > 2 && strings.HasSuffix(args[0], "bootstrapper") && slices.Contains(args, want) {
			pid, err := strconv.Atoi(e.Name())
			require.NoError(t, err)
			return pid
		}
	}
	t.Fatalf("no bootstrapper process of %s", node)
	return 0
}

// etcdMembers lists the etcd members through etcdctl in the etcd pod of control-plane-0.
func etcdMembers(t *testing.T, kubeconfig string) []string {
	t.Helper()
	out := kubectl(t, kubeconfig, "-n", "kube-system", "exec", etcdPod(t, kubeconfig), "--", "etcdctl",
		"--endpoints=https://127.0.0.1:2379", "--cacert=/etc/kubernetes/pki/etcd/ca.crt",
		"--cert=/etc/kubernetes/pki/etcd/healthcheck-client.crt", "--key=/etc/kubernetes/pki/etcd/healthcheck-client.key",
		"member", "list")
	var members []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l != "" {
			members = append(members, l)
		}
	}
	return members
}

// etcdPod names a Ready etcd pod on a Ready node, for etcdctl: control-plane-0 may be gone
// (and a removed node's mirror pod lingers for a while, looking Ready). Right after a
// control plane came back, its mirror pod's status may not say Ready yet: polled for a minute.
func etcdPod(t testing.TB, kubeconfig string) string {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if pod := readyEtcdPod(t, kubeconfig); pod != "" {
			return pod
		}
		if time.Now().After(deadline) {
			t.Fatalf("no Ready etcd pod on a Ready node within a minute")
		}
		time.Sleep(time.Second)
	}
}

// readyEtcdPod is one look of etcdPod: "" if there is none yet.
func readyEtcdPod(t testing.TB, kubeconfig string) string {
	t.Helper()
	ready := map[string]bool{}
	for _, l := range strings.Fields(kubectl(t, kubeconfig, "get", "nodes", "-o",
		`jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status}{" "}{end}`)) {
		name, status, _ := strings.Cut(l, "=")
		ready[name] = status == "True"
	}
	for _, l := range strings.Fields(kubectl(t, kubeconfig, "-n", "kube-system", "get", "pods", "-l", "component=etcd", "-o",
		`jsonpath={range .items[*]}{.metadata.name}={.spec.nodeName}={.status.conditions[?(@.type=="Ready")].status}{" "}{end}`)) {
		parts := strings.Split(l, "=")
		if len(parts) == 3 && ready[parts[1]] && parts[2] == "True" {
			return parts[0]
		}
	}
	return ""
}

// helloPod runs the hello server on node (restarted by its kubelet after a reboot).
func helloPod(t *testing.T, kubeconfig, images, node string) {
	t.Helper()
	helloPodWithin(t, kubeconfig, images, node, 2*time.Minute)
}

// helloPodWithin is helloPod waiting up to wait for the server to be Ready; on a timeout it
// fails with the pod's description.
func helloPodWithin(t *testing.T, kubeconfig, images, node string, wait time.Duration) {
	t.Helper()
	ref := helloRef(t, images)
	applyManifest(t, kubeconfig, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: hello-server, namespace: default, labels: {app: hello}}
spec:
  nodeName: %s
  containers:
  - name: hello
    image: %s
    imagePullPolicy: Never
    env: [{name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]
    ports: [{containerPort: 8080}]
    readinessProbe: {httpGet: {port: 8080, path: /}, periodSeconds: 1}
`, node, ref))
	if out, err := exec.Command(kubectlPath(t), "--kubeconfig", kubeconfig, "wait", "--for=condition=Ready", "pod/hello-server", "--timeout="+wait.String()).CombinedOutput(); err != nil {
		describe, _ := exec.Command(kubectlPath(t), "--kubeconfig", kubeconfig, "describe", "pod", "hello-server").CombinedOutput()
		t.Fatalf("the hello server on %s is not Ready: %s\n%s", node, out, describe)
	}
}

// userImageRef names the image userImage builds: no node image has it.
const userImageRef = "example.com/user/hello:v1"

// userImage builds an image as a user would: the hello image with a layer of its own (so its
// content is new), saved as `docker save` does. It returns the archive's path.
func userImage(t *testing.T, images string) string {
	t.Helper()
	index, err := nodeimage.ReadIndex(images)
	require.NoError(t, err)
	hello, err := index.Find(nodeimage.HelloRepo)
	require.NoError(t, err)
	base, err := tarball.ImageFromPath(filepath.Join(images, hello.File), nil)
	require.NoError(t, err)
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	content := []byte("loaded by constellation image load\n")
	require.NoError(t, tw.WriteHeader(&tar.Header{Name: "etc/loaded.txt", Mode: 0o644, Size: int64(len(content))}))
	_, err = tw.Write(content)
	require.NoError(t, err)
	require.NoError(t, tw.Close())
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layer.Bytes())), nil })
	require.NoError(t, err)
	img, err := mutate.AppendLayers(base, l)
	require.NoError(t, err)
	tag, err := name.NewTag(userImageRef)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "user-image.tar")
	require.NoError(t, tarball.WriteToFile(path, tag, img))
	return path
}

// loadedPod runs the loaded image on node (never pulled) and waits until it serves.
func loadedPod(t *testing.T, kubeconfig, pod, node string) {
	t.Helper()
	applyManifest(t, kubeconfig, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %[1]s, namespace: default, labels: {app: %[1]s}}
spec:
  nodeName: %[2]s
  terminationGracePeriodSeconds: 1
  containers:
  - name: hello
    image: %[3]s
    imagePullPolicy: Never
    ports: [{containerPort: 8080}]
    readinessProbe: {httpGet: {port: 8080, path: /}, periodSeconds: 1}
`, pod, node, userImageRef))
	kubectl(t, kubeconfig, "wait", "--for=condition=Ready", "pod/"+pod, "--timeout=120s")
}

// loadedStatefulSet runs the loaded image on node as a StatefulSet of one replica (pod
// <name>-0) as user 1000, with a volume "data" of the node-local StorageClass at /data where the
// server keeps what is PUT to /data, and waits until it serves.
func loadedStatefulSet(t *testing.T, kubeconfig, name, node string) {
	t.Helper()
	applyManifest(t, kubeconfig, fmt.Sprintf(`apiVersion: apps/v1
kind: StatefulSet
metadata: {name: %[1]s, namespace: default}
spec:
  replicas: 1
  selector: {matchLabels: {app: %[1]s}}
  serviceName: %[1]s
  template:
    metadata: {labels: {app: %[1]s}}
    spec:
      nodeSelector: {kubernetes.io/hostname: %[2]s}
      terminationGracePeriodSeconds: 1
      securityContext: {runAsUser: 1000, runAsGroup: 1000, runAsNonRoot: true}
      containers:
      - name: hello
        image: %[3]s
        imagePullPolicy: Never
        env: [{name: DATA_DIR, value: /data}]
        ports: [{containerPort: 8080}]
        readinessProbe: {httpGet: {port: 8080, path: /}, periodSeconds: 1}
        volumeMounts: [{name: data, mountPath: /data}]
  volumeClaimTemplates:
  - metadata: {name: data}
    spec:
      storageClassName: local-path
      accessModes: [ReadWriteOnce]
      resources: {requests: {storage: 10Mi}}
`, name, node, userImageRef))
	kubectl(t, kubeconfig, "wait", "--for=condition=Ready", "pod/"+name+"-0", "--timeout=180s")
}

// putData stores data in the hello server at addr (PUT /data) and fails the test if it is not
// stored.
func putData(t *testing.T, addr, data string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPut, "http://"+addr+"/data", strings.NewReader(data))
	require.NoError(t, err)
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	require.Equal(t, http.StatusOK, resp.StatusCode, "PUT /data: %s", body)
}

// getData returns what the hello server at addr has stored (GET /data), retrying for a minute
// while it does not answer.
func getData(t *testing.T, addr string) string {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	var got string
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		resp, err := client.Get("http://" + addr + "/data")
		if !assert.NoError(c, err) {
			return
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		assert.NoError(c, err)
		assert.Equal(c, http.StatusOK, resp.StatusCode, "GET /data: %s", body)
		got = string(body)
	}, time.Minute, time.Second, "GET http://%s/data", addr)
	return got
}

// requirePortForward runs kubectl port-forward to target's port on a free loopback port of
// the host and waits until a request through it is answered; the forward ends with the test.
func requirePortForward(t *testing.T, kubeconfig, target string, port int) {
	t.Helper()
	local := testnet.Port(t)
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, kubectlPath(t), "--kubeconfig", kubeconfig, "port-forward", target, fmt.Sprintf("%d:%d", local, port))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	client := &http.Client{Timeout: 2 * time.Second}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/", local))
		if !assert.NoError(c, err) {
			return
		}
		_ = resp.Body.Close()
		assert.Equal(c, http.StatusOK, resp.StatusCode)
	}, time.Minute, 500*time.Millisecond, "kubectl port-forward to %s answers (kubectl: %s)", target, &out)
}

// loadBalancerService exposes pod (label app=<pod>, port 8080) by a LoadBalancer Service and
// waits until its address (status.loadBalancer.ingress, set by the local provider) and its
// node port on the host's loopback answer from the host. It returns both host:port.
func loadBalancerService(t *testing.T, kubeconfig, pod string) (lb, nodePort string) {
	t.Helper()
	applyManifest(t, kubeconfig, fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: %[1]s, namespace: default}
spec:
  type: LoadBalancer
  selector: {app: %[1]s}
  ports: [{port: 8081, targetPort: 8080}]
`, pod))
	var ip string
	bin := kubectlPath(t)
	require.Eventually(t, func() bool {
		ip = kubectlQuiet(bin, kubeconfig, "get", "service", pod, "-o", "jsonpath={.status.loadBalancer.ingress[0].ip}")
		return ip != ""
	}, time.Minute, time.Second, "the LoadBalancer Service gets an address")
	port := kubectl(t, kubeconfig, "get", "service", pod, "-o", "jsonpath={.spec.ports[0].nodePort}")
	lb, nodePort = net.JoinHostPort(ip, "8081"), net.JoinHostPort("127.0.0.1", port)
	requireAnswers(t, lb)
	requireAnswers(t, nodePort)
	return lb, nodePort
}

// requireAnswers waits (a minute at most) until an HTTP request to addr from the host gets 200.
func requireAnswers(t *testing.T, addr string) {
	t.Helper()
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		resp, err := client.Get("http://" + addr + "/")
		if !assert.NoError(c, err) {
			return
		}
		_ = resp.Body.Close()
		assert.Equal(c, http.StatusOK, resp.StatusCode)
	}, time.Minute, 500*time.Millisecond, "http://%s answers from the host", addr)
}

// kubectlQuiet runs kubectl and returns its output, or "" if it failed (for polling).
func kubectlQuiet(bin, kubeconfig string, args ...string) string {
	out, err := exec.Command(bin, append([]string{"--kubeconfig", kubeconfig}, args...)...).Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}
