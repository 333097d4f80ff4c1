package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/provider/local/cluster"
)

// TestFaults is the fault-injection tier: in one running local cluster it kills, one after the
// other, a verification service while `verify` runs, a node's swtpm (a failed TPM chip), the
// join service while a new worker asks for its ticket, the API server while `apply` adds
// control planes, and etcd's leader while `apply` removes their members. Each fault must
// converge (the command succeeds, the cluster is healthy again) with nothing lost: a
// ConfigMap written before and a pod keep existing, etcd's members are the control planes,
// every node is Ready and `verify` passes. The faults are ordered so that each leaves the
// cluster healthy for the next; how long each took to converge is logged.
func TestFaults(t *testing.T) {
	bin, _ := buildBinaries(t)
	ws := t.TempDir()
	images := filepath.Join(repoOutput(t), "images")
	d := &dayTwo{t: t, bin: bin, ws: ws, kubeconfig: filepath.Join(ws, "constellation-admin.conf")}
	tierStart := time.Now()
	out := miniUp(t, bin, ws, "--workers", "1")
	t.Logf("mini up:\n%s", phases(out))
	d.requireHealthy("control-plane-0", "worker-0")
	helloPod(t, d.kubeconfig, images, "worker-0")
	kubectl(t, d.kubeconfig, "create", "configmap", "survivor", "--from-literal=written=before")
	// Every fault below must leave the cluster as a healthy cluster of nodes, with the data
	// written before intact.
	nothingLost := func(d *dayTwo, nodes ...string) {
		d.t.Helper()
		d.requireHealthy(nodes...)
		var cps []string
		for _, n := range nodes {
			if strings.HasPrefix(n, "control-plane-") {
				cps = append(cps, n)
			}
		}
		d.requireConsistent(cps...)
		kubectl(d.t, d.kubeconfig, "wait", "--for=condition=Ready", "pod/hello-server", "--timeout=120s")
		d.run("verify")
	}

	t.Run("a verification service killed while verify runs", func(t *testing.T) {
		d := d.on(t)
		// Killed twice: its kubelet restarts the container at once after the first exit and
		// only after a back-off (10 s) after the second, so verify surely finds it down (a
		// single kill is often repaired before verify asks worker-0).
		var start time.Time
		var killed []int
		for range 2 {
			var pids []int
			require.Eventually(t, func() bool {
				pids = slices.DeleteFunc(nodeProcesses(t, ws, "worker-0", "verificationservice"), func(pid int) bool { return slices.Contains(killed, pid) })
				return len(pids) > 0
			}, 2*time.Minute, 50*time.Millisecond, "the verification service runs on worker-0")
			start = time.Now()
			for _, pid := range pids {
				require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
			}
			killed = append(killed, pids...)
		}
		// verify asks control-plane-0, then worker-0, whose service is down until its kubelet
		// restarted the container: verify waits for it, saying so, and passes.
		out := d.run("verify")
		t.Logf("verify converged %.1fs after the kill:\n%s", time.Since(start).Seconds(), out)
		assert.Regexp(t, `waiting    worker-0: its verification service at 10\.42\.0\.11:30081 to answer; last error: .*connection refused`, out)
		assert.Contains(t, out, "OK    worker-0")
		assert.Contains(t, out, "2 of 2 nodes verified")
		nothingLost(d, "control-plane-0", "worker-0")
	})

	t.Run("a node's swtpm dies: the watchdog reboots the node", func(t *testing.T) {
		d := d.on(t)
		pid := swtpmPID(t, ws, "worker-0")
		start := time.Now()
		require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
		var s statusJSON
		require.Eventually(t, func() bool {
			s = d.status()
			i, ok := s.node("worker-0")
			return ok && s.Nodes[i].Provider != nil && s.Nodes[i].Provider.Boots == 2 && s.Nodes[i].Provider.Reported == "rejoined"
		}, 2*time.Minute, time.Second, "worker-0 is rebooted by the watchdog and rejoins")
		waitFreshReady(t, d.kubeconfig, "worker-0", start)
		d.run("verify", "--node", "worker-0")
		t.Logf("worker-0 back, Ready and verified %.1fs after its TPM died", time.Since(start).Seconds())
		i, _ := s.node("worker-0")
		var events []string
		for _, e := range s.Nodes[i].Provider.Events {
			events = append(events, e.Message)
		}
		assert.True(t, slices.ContainsFunc(events, func(e string) bool {
			return strings.Contains(e, "TPM failed") && strings.Contains(e, "rebooting")
		}), "the platform's events name the TPM failure: %v", events)
		nothingLost(d, "control-plane-0", "worker-0")
	})

	t.Run("the join service killed while a new worker asks for its ticket", func(t *testing.T) {
		d := d.on(t)
		d.setCounts(1, 2)
		apply := d.start("apply")
		apply.waitLine(`^\[\s*[0-9.]+s\] create\s`, 2*time.Minute)
		// From the moment worker-1 boots, its join service is killed whenever it runs, until
		// worker-1 has seen an attempt fail: a single kill races the node's first request
		// (which takes milliseconds) and may miss it. Killed twice, the service waits out its
		// kubelet's restart back-off (10 s) while the node asks.
		nodeLog := filepath.Join(ws, "mini", "nodes", "worker-1", "logs", "bootstrapper.log")
		failedAttempt := regexp.MustCompile(`"msg":"(waiting for a join service|join attempt refused)"`)
		start := time.Now()
		kills := 0
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
			if data, err := os.ReadFile(nodeLog); err == nil && failedAttempt.Match(data) {
				break
			}
			require.False(t, time.Now().After(deadline), "worker-1 saw no failed join attempt within 2m while its join service was killed %d times", kills)
			for _, pid := range nodeProcesses(t, ws, "control-plane-0", "joinservice") {
				if syscall.Kill(pid, syscall.SIGKILL) == nil {
					kills++
				}
			}
		}
		require.Positive(t, kills, "the join service ran on control-plane-0 and was killed")
		t.Logf("killed the join service %d time(s) until worker-1's attempt failed", kills)
		out, err := apply.wait()
		require.NoError(t, err, "apply: %s", out)
		t.Logf("apply converged %.1fs after the join service was killed:\n%s", time.Since(start).Seconds(), out)
		// The worker got its ticket after attempts that found no join service (unreachable)
		// or one killed mid-answer (refused, for the node's back-off).
		ticket := matchFile(t, nodeLog, `"msg":"ticket received".*"unreachableAttempts":(\d+),"refusedAttempts":(\d+)`)
		t.Logf("worker-1: %s", ticket[0])
		unreachable, _ := strconv.Atoi(ticket[1])
		refused, _ := strconv.Atoi(ticket[2])
		assert.Positive(t, unreachable+refused, "the ticket counts worker-1's failed attempts")
		nothingLost(d, "control-plane-0", "worker-0", "worker-1")
	})

	t.Run("the API server killed while apply adds control planes", func(t *testing.T) {
		d := d.on(t)
		d.setCounts(3, 2)
		apply := d.start("apply")
		apply.waitLine(`^\[\s*[0-9.]+s\] create\s`, 2*time.Minute)
		start := time.Now()
		pids := nodeProcesses(t, ws, "control-plane-0", "kube-apiserver")
		require.NotEmpty(t, pids, "kube-apiserver runs on control-plane-0")
		for _, pid := range pids {
			require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
		}
		out, err := apply.wait()
		require.NoError(t, err, "apply: %s", out)
		t.Logf("apply converged %.1fs after the API server was killed:\n%s", time.Since(start).Seconds(), out)
		nothingLost(d, "control-plane-0", "control-plane-1", "control-plane-2", "worker-0", "worker-1")
	})

	t.Run("etcd's leader killed while apply removes members", func(t *testing.T) {
		d := d.on(t)
		d.setCounts(1, 2)
		apply := d.start("apply")
		// The removal of the newest control plane begins with its drain; its member is
		// removed next.
		apply.waitLine(`^\[\s*[0-9.]+s\] drain\s+control-plane-2`, 2*time.Minute)
		leader := etcdLeader(t, d.kubeconfig)
		start := time.Now()
		pids := nodeProcesses(t, ws, leader, "etcd")
		require.NotEmpty(t, pids, "etcd runs on %s", leader)
		for _, pid := range pids {
			require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
		}
		t.Logf("killed etcd's leader, the member of %s", leader)
		out, err := apply.wait()
		require.NoError(t, err, "apply: %s", out)
		t.Logf("apply converged %.1fs after etcd's leader was killed:\n%s", time.Since(start).Seconds(), out)
		nothingLost(d, "control-plane-0", "worker-0", "worker-1")
	})
	t.Logf("the fault tier took %.0fs (cluster creation included)", time.Since(tierStart).Seconds())
}

// nodeProcesses lists the processes of node (its cgroup) of the cluster of ws whose command
// is exe (the base name of argv[0]).
func nodeProcesses(t *testing.T, ws, node, exe string) []int {
	t.Helper()
	cg := "/cmini-" + cluster.NetworkID(filepath.Join(ws, "mini")) + "/" + node + "/"
	entries, err := os.ReadDir("/proc")
	require.NoError(t, err)
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(cmdline) == 0 {
			continue
		}
		if filepath.Base(strings.Split(string(cmdline), "\x00")[0]) != exe {
			continue
		}
		if cgroups, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup")); err == nil && strings.Contains(string(cgroups), cg) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// swtpmPID finds the swtpm of node in the cluster of ws (a process of the provider, serving
// the TPM state in the node's folder).
func swtpmPID(t *testing.T, ws, node string) int {
	t.Helper()
	state := "dir=" + filepath.Join(ws, "mini", "nodes", node, "tpm")
	entries, err := os.ReadDir("/proc")
	require.NoError(t, err)
	for _, e := range entries {
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if filepath.Base(args[0]) == "swtpm" && slices.Contains(args, state) {
			pid, err := strconv.Atoi(e.Name())
			require.NoError(t, err)
			return pid
		}
	}
	t.Fatalf("no swtpm of %s", node)
	return 0
}

// etcdctl runs etcdctl with args (JSON output) in control-plane-0's etcd pod, as its
// health-check client.
func etcdctl(t testing.TB, kubeconfig string, args ...string) string {
	t.Helper()
	return kubectl(t, kubeconfig, append([]string{"-n", "kube-system", "exec", etcdPod(t, kubeconfig), "--", "etcdctl",
		"--endpoints=https://127.0.0.1:2379", "--cacert=/etc/kubernetes/pki/etcd/ca.crt",
		"--cert=/etc/kubernetes/pki/etcd/healthcheck-client.crt", "--key=/etc/kubernetes/pki/etcd/healthcheck-client.key",
		"-w", "json"}, args...)...)
}

// etcdMember is one member of etcdctl member list.
type etcdMember struct {
	ID         uint64
	Name       string
	ClientURLs []string
}

// etcdLeaderMember finds the member that leads, as etcdctl endpoint status says, and the
// whole member list.
func etcdLeaderMember(t testing.TB, kubeconfig string) (etcdMember, []etcdMember) {
	t.Helper()
	var statuses []struct {
		Status struct {
			Leader uint64
		}
	}
	out := etcdctl(t, kubeconfig, "endpoint", "status", "--cluster")
	require.NoError(t, json.Unmarshal([]byte(out), &statuses), "%s", out)
	require.NotEmpty(t, statuses)
	leader := statuses[0].Status.Leader
	require.NotZero(t, leader, "etcd has a leader: %s", out)
	var members struct{ Members []etcdMember }
	out = etcdctl(t, kubeconfig, "member", "list")
	require.NoError(t, json.Unmarshal([]byte(out), &members), "%s", out)
	for _, m := range members.Members {
		if m.ID == leader {
			return m, members.Members
		}
	}
	t.Fatalf("the leader %x is no member: %s", leader, out)
	return etcdMember{}, nil
}

// etcdLeader names the node whose etcd member leads.
func etcdLeader(t testing.TB, kubeconfig string) string {
	t.Helper()
	m, _ := etcdLeaderMember(t, kubeconfig)
	return m.Name
}

// moveEtcdLeader makes the member of node etcd's leader (etcdctl move-leader, sent to every
// member's endpoint: etcdctl finds the leader among them).
func moveEtcdLeader(t testing.TB, kubeconfig, node string) {
	t.Helper()
	leader, members := etcdLeaderMember(t, kubeconfig)
	if leader.Name == node {
		return
	}
	var target uint64
	var endpoints []string
	for _, m := range members {
		endpoints = append(endpoints, m.ClientURLs...)
		if m.Name == node {
			target = m.ID
		}
	}
	require.NotZero(t, target, "%s has an etcd member", node)
	kubectl(t, kubeconfig, "-n", "kube-system", "exec", "etcd-control-plane-0", "--", "etcdctl",
		"--endpoints="+strings.Join(endpoints, ","), "--cacert=/etc/kubernetes/pki/etcd/ca.crt",
		"--cert=/etc/kubernetes/pki/etcd/healthcheck-client.crt", "--key=/etc/kubernetes/pki/etcd/healthcheck-client.key",
		"move-leader", strconv.FormatUint(target, 16))
	require.Equal(t, node, etcdLeader(t, kubeconfig), "etcd's leader after move-leader")
}

// matchFile returns the last match of pattern in the file at path, and fails if none.
func matchFile(t *testing.T, path, pattern string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	all := regexp.MustCompile(pattern).FindAllStringSubmatch(string(data), -1)
	require.NotEmpty(t, all, "%s has no line matching %q", path, pattern)
	return all[len(all)-1]
}

// running is a CLI command running in the background, its output read line by line.
type running struct {
	t     *testing.T
	cmd   *exec.Cmd
	args  []string
	lines chan string
	mu    sync.Mutex
	out   strings.Builder

	once    sync.Once
	exited  chan error    // the command's exit, once
	scanned chan struct{} // closed once every line of the output was read
	err     error
}

// start runs the CLI with args in the background; the test waits for it with wait.
func (d *dayTwo) start(args ...string) *running {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	r := &running{t: d.t, args: args, lines: make(chan string, 1024), exited: make(chan error, 1), scanned: make(chan struct{})}
	r.cmd = exec.CommandContext(ctx, d.bin, append(args, "-C", d.ws)...)
	pr, pw := io.Pipe()
	r.cmd.Stdout, r.cmd.Stderr = pw, pw
	require.NoError(d.t, r.cmd.Start())
	go func() {
		err := r.cmd.Wait()
		pw.Close()
		r.exited <- err
	}()
	go func() {
		defer close(r.scanned)
		defer close(r.lines)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			r.mu.Lock()
			r.out.WriteString(sc.Text() + "\n")
			r.mu.Unlock()
			select {
			case r.lines <- sc.Text():
			default: // nobody waits for lines now; the output keeps them
			}
		}
	}()
	d.t.Cleanup(func() {
		cancel()
		<-r.scanned
	})
	return r
}

// waitLine waits until the command printed a line matching pattern, and fails the test if it
// ended first or timeout passed.
func (r *running) waitLine(pattern string, timeout time.Duration) string {
	r.t.Helper()
	re := regexp.MustCompile(pattern)
	deadline := time.After(timeout)
	for {
		select {
		case l, ok := <-r.lines:
			if !ok {
				out, err := r.wait()
				r.t.Fatalf("constellation %s ended (%v) before printing %q:\n%s", strings.Join(r.args, " "), err, pattern, out)
			}
			if re.MatchString(l) {
				return l
			}
		case <-deadline:
			r.t.Fatalf("constellation %s printed no line matching %q within %s:\n%s", strings.Join(r.args, " "), pattern, timeout, r.output())
		}
	}
}

func (r *running) output() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.out.String()
}

// wait waits for the command to end and returns its output and exit error.
func (r *running) wait() (string, error) {
	r.once.Do(func() {
		// Drain the lines nobody waits for any more, so the reader never blocks.
		go func() {
			for range r.lines {
			}
		}()
		r.err = <-r.exited
		<-r.scanned
	})
	return r.output(), r.err
}
