package e2e

import (
	"bufio"
	"context"
	"io"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/provider/local/cluster"
	"github.com/openconstellation/constellation/internal/state"
)

// killAt runs the CLI with args and SIGKILLs it as soon as it prints a line matching
// boundary (a step boundary read from its output), and returns what it printed. The test
// fails if the command ends before it reached the boundary.
func (d *dayTwo) killAt(boundary string, args ...string) string {
	d.t.Helper()
	re := regexp.MustCompile(boundary)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, d.bin, append(args, "-C", d.ws)...)
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	require.NoError(d.t, cmd.Start())
	waited := make(chan error, 1)
	go func() {
		waited <- cmd.Wait()
		pw.Close()
	}()
	var out strings.Builder
	killed := false
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		out.WriteString(sc.Text() + "\n")
		if !killed && re.MatchString(sc.Text()) {
			require.NoError(d.t, cmd.Process.Signal(syscall.SIGKILL))
			killed = true
		}
	}
	err := <-waited
	require.True(d.t, killed, "constellation %s ended (%v) before %q:\n%s", strings.Join(args, " "), err, boundary, out.String())
	d.t.Logf("constellation %s, killed at %q:\n%s", strings.Join(args, " "), boundary, out.String())
	return out.String()
}

// requireConsistent checks what a killed command must not leave behind: a machine the state
// file does not know or a node of the state file without a machine, a removed node's machine,
// etcd members other than the control planes, lost data.
func (d *dayTwo) requireConsistent(controlPlanes ...string) {
	d.t.Helper()
	st, err := state.Load(filepath.Join(d.ws, state.FileName))
	require.NoError(d.t, err)
	platform := &cluster.Local{Dir: filepath.Join(d.ws, "mini"), Exe: d.bin}
	nodes, err := platform.Nodes(d.t.Context())
	require.NoError(d.t, err)
	var onPlatform, inState []string
	for _, n := range nodes {
		onPlatform = append(onPlatform, n.Name)
	}
	for _, n := range st.Nodes {
		inState = append(inState, n.Name)
	}
	assert.ElementsMatch(d.t, inState, onPlatform, "the platform's machines are the state file's nodes")
	for _, r := range st.Removed {
		assert.NotContains(d.t, onPlatform, r.Name, "a removed node has no machine")
	}
	members := etcdMembers(d.t, d.kubeconfig)
	assert.Len(d.t, members, len(controlPlanes), "etcd members: %v", members)
	for _, cp := range controlPlanes {
		assert.True(d.t, slices.ContainsFunc(members, func(m string) bool { return strings.Contains(m, cp) }), "%s has an etcd member: %v", cp, members)
	}
	assert.Equal(d.t, "before", kubectl(d.t, d.kubeconfig, "get", "configmap", "survivor", "-o", "jsonpath={.data.written}"))
}

// TestKilledCommands SIGKILLs the CLI in the middle of apply scaling up and down (workers and
// control planes), of reboot and of recover, at step boundaries read from its output, and runs
// the command again: it converges, with no orphaned machine, etcd members equal to the control
// planes, and a workload's data intact. A kill inside the platform's create request races with
// the request; the machine it leaves behind is also made directly, so that adoption is always
// exercised.
func TestKilledCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("creates a local cluster")
	}
	bin, _ := buildBinaries(t)
	ws := t.TempDir()
	images := filepath.Join(repoOutput(t), "images")
	d := &dayTwo{t: t, bin: bin, ws: ws, kubeconfig: filepath.Join(ws, "constellation-admin.conf")}
	miniUp(t, bin, ws, "--workers", "1")
	d.requireHealthy("control-plane-0", "worker-0")
	helloPod(t, d.kubeconfig, images, "worker-0")
	kubectl(t, d.kubeconfig, "create", "configmap", "survivor", "--from-literal=written=before")

	t.Run("apply adding a worker, killed while the platform creates it", func(t *testing.T) {
		d := d.on(t)
		d.setCounts(1, 2)
		// The plan is printed, then the platform is asked for the node: the kill lands in
		// that request or right after it; the platform goes on creating the machine.
		d.killAt(`^\s+\+ worker-1 `, "apply")
		out := d.run("apply")
		t.Logf("%s", out)
		d.requireHealthy("control-plane-0", "worker-0", "worker-1")
		d.requireConsistent("control-plane-0")
	})

	t.Run("apply removing a worker, killed after the drain", func(t *testing.T) {
		d := d.on(t)
		d.setCounts(1, 1)
		d.killAt(`^\[\s*[0-9.]+s\] drain\s+worker-1`, "apply")
		out := d.run("apply")
		t.Logf("%s", out)
		d.requireHealthy("control-plane-0", "worker-0")
		d.requireConsistent("control-plane-0")
		st, err := state.Load(filepath.Join(ws, state.FileName))
		require.NoError(t, err)
		assert.True(t, slices.ContainsFunc(st.Removed, func(r state.RemovedNode) bool { return r.Name == "worker-1" }))
	})

	t.Run("an apply killed after the platform created a node, before recording it", func(t *testing.T) {
		d := d.on(t)
		// What the platform has after such a kill: a machine the state file does not know
		// (the kill above may land before or after the request; this is the case after it).
		platform := &cluster.Local{Dir: filepath.Join(ws, "mini"), Exe: bin}
		_, err := platform.CreateNodes(t.Context(), []provider.NodeSpec{{Name: "worker-2", Role: metadata.Worker, Image: filepath.Join(ws, "mini", "image")}})
		require.NoError(t, err)
		d.setCounts(1, 2)
		out := d.run("apply")
		t.Logf("%s", out)
		assert.Contains(t, out, "adopting worker-2")
		assert.NotContains(t, out, "+ worker-", "nothing else is created")
		d.requireHealthy("control-plane-0", "worker-0", "worker-2")
		d.requireConsistent("control-plane-0")
		d.setCounts(1, 1)
		d.run("apply")
		d.requireConsistent("control-plane-0")
	})

	t.Run("apply adding control planes, killed while they join", func(t *testing.T) {
		d := d.on(t)
		d.setCounts(3, 1)
		d.killAt(`^\[\s*[0-9.]+s\] create\s`, "apply")
		out := d.run("apply")
		t.Logf("%s", out)
		d.requireHealthy("control-plane-0", "control-plane-1", "control-plane-2", "worker-0")
		d.requireConsistent("control-plane-0", "control-plane-1", "control-plane-2")
	})

	t.Run("apply removing control planes, killed after an etcd member was removed", func(t *testing.T) {
		d := d.on(t)
		d.setCounts(1, 1)
		// The newest control plane goes first; once its member is removed etcd elects a
		// leader, and the kill leaves its Node and machine behind.
		d.killAt(`^\[\s*[0-9.]+s\] etcd\s`, "apply")
		out := d.run("apply")
		t.Logf("%s", out)
		d.requireHealthy("control-plane-0", "worker-0")
		d.requireConsistent("control-plane-0")
	})

	t.Run("reboot, killed once the platform rebooted the node", func(t *testing.T) {
		d := d.on(t)
		d.killAt(`^\[\s*[0-9.]+s\] reboot\s+worker-0`, "reboot", "worker-0")
		out := d.run("reboot", "worker-0")
		t.Logf("%s", out)
		assert.Contains(t, out, "worker-0 (Ready by a fresh kubelet heartbeat, verification service up)")
		d.requireHealthy("control-plane-0", "worker-0")
		kubectl(t, d.kubeconfig, "wait", "--for=condition=Ready", "pod/hello-server", "--timeout=120s")
		d.requireConsistent("control-plane-0")
	})

	t.Run("recover, killed once the control plane got its keys", func(t *testing.T) {
		d := d.on(t)
		d.run("reboot", "--no-wait", "control-plane-0")
		require.Eventually(t, func() bool {
			s := d.status()
			i, ok := s.node("control-plane-0")
			return ok && s.Nodes[i].Provider != nil && s.Nodes[i].Provider.Reported == "waiting-for-recovery"
		}, 2*time.Minute, time.Second, "the control plane waits for recovery")
		d.killAt(`^\[\s*[0-9.]+s\] recovered\s+control-plane-0`, "recover")
		out := d.run("recover")
		t.Logf("%s", out)
		d.requireHealthy("control-plane-0", "worker-0")
		kubectl(t, d.kubeconfig, "wait", "--for=condition=Ready", "pod/hello-server", "--timeout=120s")
		d.requireConsistent("control-plane-0")
	})
}
