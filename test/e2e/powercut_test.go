package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// TestPowerCut cuts the power of a local cluster (one control plane, one worker) while a
// workload writes to it: a worker alone, which comes back by itself; the whole cluster with
// its provider, which `start` and `recover` bring back with every acknowledged write intact;
// and the reported failure, two ordinary reboots of the control plane (each recovered) and
// then a power cut of the whole cluster, after which the control plane's TPM used to be in
// dictionary-attack lockout and `recover` never succeeded.
func TestPowerCut(t *testing.T) {
	bin, _ := buildBinaries(t)
	ws := t.TempDir()
	images := filepath.Join(repoOutput(t), "images")
	d := &dayTwo{t: t, bin: bin, ws: ws, kubeconfig: filepath.Join(ws, "constellation-admin.conf")}
	nodes := []string{"control-plane-0", "worker-0"}
	out := miniUp(t, bin, ws, "--workers", "1")
	t.Logf("mini up:\n%s", phases(out))
	d.requireHealthy(nodes...)
	helloPod(t, d.kubeconfig, images, "worker-0")
	kubectl(t, d.kubeconfig, "create", "configmap", "survivor", "--from-literal=written=before")
	// The README's application, its data on an encrypted volume of the default StorageClass:
	// after every power cut the node gets the volume's key again and the data is there.
	app := deployVolumeApp(t, d.kubeconfig, images, "app", "", "")
	const appData = "written before the power cuts"
	app.put(appData)

	t.Run("a worker's power cut: it comes back by itself", func(t *testing.T) {
		d := d.on(t)
		w := startWriter(t, d.kubeconfig)
		mnt := mountNamespace(t, bootstrapperPID(t, ws, "worker-0"))
		before := time.Now()
		out := d.run("mini", "power-cut", "worker-0")
		t.Logf("%s", out)
		// It returns once the node booted again: any kubelet heartbeat from now on is the new
		// boot's.
		booted := time.Now()
		assert.Empty(t, processesIn(t, mnt), "nothing of the node's last boot runs: its mount namespace, and its tmpfs, are gone")
		var s statusJSON
		require.Eventually(t, func() bool {
			s = d.status()
			i, ok := s.node("worker-0")
			return ok && s.Nodes[i].Provider != nil && s.Nodes[i].Provider.Boots == 2 && s.Nodes[i].Provider.Reported == "rejoined"
		}, 2*time.Minute, time.Second, "worker-0 boots again and rejoins by itself")
		waitFreshReady(t, d.kubeconfig, "worker-0", booted)
		d.requireHealthy(nodes...)
		t.Logf("worker-0 back, Ready and verified %.1fs after its power cut", time.Since(before).Seconds())
		i, _ := s.node("worker-0")
		assert.True(t, slices.ContainsFunc(s.Nodes[i].Provider.Events, func(e struct{ Message string }) bool { return e.Message == "power cut" }),
			"the platform's events name the power cut: %v", s.Nodes[i].Provider.Events)
		d.run("verify")
		kubectl(t, d.kubeconfig, "wait", "--for=condition=Ready", "pod/hello-server", "--timeout=120s")
		acked, attempted := w.stop()
		assert.Greater(t, acked-w.initial, 10, "the control plane kept taking writes while the worker was off")
		w.requireKept(acked, attempted)
	})

	cutCluster := func(t *testing.T, d *dayTwo) {
		w := startWriter(t, d.kubeconfig)
		time.Sleep(2 * time.Second) // writes in flight when the power goes
		start := time.Now()
		d.run("mini", "power-cut")
		acked, attempted := w.stop()
		require.Greater(t, acked, w.initial, "writes were acknowledged right before the cut")
		assert.Empty(t, processesMentioning(t, filepath.Join(ws, "mini")), "no process of the cluster survives, the provider included")
		out := d.run("start")
		t.Logf("%s", out)
		started := time.Since(start)
		// recover polls the platform until the control plane waits for it; status is not
		// polled here (it takes seconds while the cluster is down, which the timing below
		// would count).
		out = d.recover()
		t.Logf("%s", out)
		recovered := time.Since(start)
		d.run("verify")
		t.Logf("power cut of the whole cluster: started %.1fs, every node Ready after %.1fs, verified after %.1fs",
			started.Seconds(), recovered.Seconds(), time.Since(start).Seconds())
		d.requireHealthy(nodes...)
		w.requireKept(acked, attempted)
		assert.Equal(t, "before", kubectl(t, d.kubeconfig, "get", "configmap", "survivor", "-o", "jsonpath={.data.written}"))
		kubectl(t, d.kubeconfig, "wait", "--for=condition=Ready", "pod/hello-server", "--timeout=120s")
		app.requireData(appData)
	}

	t.Run("the whole cluster's power cut: start and recover bring it back", func(t *testing.T) {
		cutCluster(t, d.on(t))
	})

	t.Run("two reboots of the control plane, then a power cut", func(t *testing.T) {
		d := d.on(t)
		for i := range 2 {
			d.run("reboot", "--no-wait", "control-plane-0")
			d.waitReported("control-plane-0", "waiting-for-recovery")
			out := d.recover()
			t.Logf("reboot %d: %s", i+1, out)
			d.requireHealthy(nodes...)
		}
		cutCluster(t, d)
	})
}

// recover runs `constellation recover`; if it fails, the failure names what each node's
// bootstrapper reported (a TPM that cannot quote says why).
func (d *dayTwo) recover() string {
	d.t.Helper()
	out, err := exec.Command(d.bin, "recover", "--timeout", "4m", "-C", d.ws).CombinedOutput()
	if err == nil {
		return string(out)
	}
	var reports []string
	for _, n := range d.status().Nodes {
		if p := n.Provider; p != nil {
			reports = append(reports, fmt.Sprintf("%s: %s (%s) %s", n.Name, p.State, p.Reported, p.ReportedDetail))
		}
	}
	d.t.Fatalf("constellation recover: %v: %s\nthe nodes reported: %s", err, out, strings.Join(reports, "; "))
	return ""
}

// waitReported waits (2 minutes at most) until node's bootstrapper reported phase, and fails
// naming what it reported instead (a TPM that cannot quote says why).
func (d *dayTwo) waitReported(node, phase string) {
	d.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	last := "not listed"
	for time.Now().Before(deadline) {
		s := d.status()
		if i, ok := s.node(node); ok && s.Nodes[i].Provider != nil {
			p := s.Nodes[i].Provider
			if p.Reported == phase {
				return
			}
			last = fmt.Sprintf("%s (%s) %s", p.State, p.Reported, p.ReportedDetail)
		}
		time.Sleep(time.Second)
	}
	d.t.Fatalf("%s did not report %s; last: %s", node, phase, last)
}

// writer updates a ConfigMap with an increasing counter, as fast as the API server
// acknowledges, until stopped: a workload whose acknowledged writes a power cut must not
// lose (etcd syncs each before the API server answers).
type writer struct {
	t         *testing.T
	client    kubernetes.Interface
	cancel    context.CancelFunc
	done      chan struct{}
	mu        sync.Mutex
	initial   int // the value when the writer started
	acked     int // the last value the API server acknowledged
	attempted int // the highest value sent
}

const writerConfigMap = "power-writer"

func startWriter(t *testing.T, kubeconfig string) *writer {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	require.NoError(t, err)
	// Short: a request the power cut leaves hanging must not hold the writer up.
	cfg.Timeout = 3 * time.Second
	client, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	w := &writer{t: t, client: client, cancel: cancel, done: make(chan struct{})}
	cms := client.CoreV1().ConfigMaps("default")
	cm, err := cms.Get(ctx, writerConfigMap, metav1.GetOptions{})
	if err != nil {
		cm, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: writerConfigMap}, Data: map[string]string{"n": "0"}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	n, err := strconv.Atoi(cm.Data["n"])
	require.NoError(t, err)
	w.initial, w.acked, w.attempted = n, n, n
	t.Cleanup(func() { w.stop() })
	go func() {
		defer close(w.done)
		for ctx.Err() == nil {
			stored, _ := strconv.Atoi(cm.Data["n"])
			next := stored + 1
			w.mu.Lock()
			w.attempted = max(w.attempted, next)
			w.mu.Unlock()
			cm.Data = map[string]string{"n": strconv.Itoa(next)}
			updated, err := cms.Update(ctx, cm, metav1.UpdateOptions{})
			if err != nil {
				// The API server is down or answered late: the write may or may not have
				// happened. Read it back before writing on (a stale version conflicts).
				select {
				case <-ctx.Done():
				case <-time.After(200 * time.Millisecond):
				}
				if cur, err := cms.Get(ctx, writerConfigMap, metav1.GetOptions{}); err == nil {
					cm = cur
				} else {
					cm.Data = map[string]string{"n": strconv.Itoa(stored)}
				}
				continue
			}
			cm = updated
			w.mu.Lock()
			w.acked = next
			w.mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	}()
	return w
}

// stop ends the writer and returns the last acknowledged and the highest sent value.
func (w *writer) stop() (acked, attempted int) {
	w.cancel()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.acked, w.attempted
}

// requireKept checks that the cluster holds every acknowledged write and nothing never sent.
func (w *writer) requireKept(acked, attempted int) {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var cm *corev1.ConfigMap
	var err error
	for cm == nil {
		if cm, err = w.client.CoreV1().ConfigMaps("default").Get(ctx, writerConfigMap, metav1.GetOptions{}); err != nil {
			cm = nil
			require.NoError(w.t, ctx.Err(), "reading %s: %v", writerConfigMap, err)
			time.Sleep(time.Second)
		}
	}
	n, err := strconv.Atoi(cm.Data["n"])
	require.NoError(w.t, err)
	assert.GreaterOrEqual(w.t, n, acked, "every write acknowledged before the power cut is kept")
	assert.LessOrEqual(w.t, n, attempted, "nothing that was never written")
	w.t.Logf("%s: %d acknowledged before the cut, %d sent, %d kept", writerConfigMap, acked, attempted, n)
}

// mountNamespace is the mount namespace of pid ("mnt:[4026532…]").
func mountNamespace(t *testing.T, pid int) string {
	t.Helper()
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
	require.NoError(t, err)
	return ns
}

// processesIn lists the processes in mount namespace ns.
func processesIn(t *testing.T, ns string) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	require.NoError(t, err)
	var found []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		if got, err := os.Readlink(filepath.Join("/proc", e.Name(), "ns", "mnt")); err == nil && got == ns {
			cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			found = append(found, e.Name()+": "+strings.ReplaceAll(string(cmdline), "\x00", " "))
		}
	}
	return found
}

// waitFreshReady waits (2 minutes at most) until node's kubelet reported Ready since since
// (heartbeats have whole seconds), which must be after the node booted: a Node keeps its
// Ready condition for a while after its kubelet died, so only a heartbeat of the kubelet of
// the new boot counts (as `constellation reboot` waits).
func waitFreshReady(t testing.TB, kubeconfig, node string, since time.Time) {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	require.NoError(t, err)
	cfg.Timeout = 10 * time.Second
	client, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	deadline := time.Now().Add(2 * time.Minute)
	last := "not read"
	for time.Now().Before(deadline) {
		n, err := client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
		} else {
			for _, c := range n.Status.Conditions {
				if c.Type != corev1.NodeReady {
					continue
				}
				if c.Status == corev1.ConditionTrue && !c.LastHeartbeatTime.Time.Before(since.Truncate(time.Second)) {
					return
				}
				last = fmt.Sprintf("Ready=%s, heartbeat %s", c.Status, c.LastHeartbeatTime.Format(time.RFC3339))
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s: no Ready heartbeat since %s (last: %s)", node, since.Format(time.RFC3339), last)
}
