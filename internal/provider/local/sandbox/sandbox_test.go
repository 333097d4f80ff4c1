package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/testtier"
)

// TestNetworkAndCgroup builds a two-node network, serves in one node's namespace, dials it
// from the bridge namespace and from the other node (through the bridge), runs a process in
// a cgroup, and removes everything again.
func TestNetworkAndCgroup(t *testing.T) {
	testtier.Integration(t, "network namespaces and cgroups, as root")
	idBytes := make([]byte, 3)
	_, _ = rand.Read(idBytes)
	n := Network{ID: hex.EncodeToString(idBytes)}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	t.Cleanup(func() { _ = n.Delete(context.Background(), []string{"a", "b", "c"}) })

	require.NoError(t, n.CreateBridge(ctx))
	require.NoError(t, n.AddNode(ctx, "a", 0, []int{0, 1}))
	require.NoError(t, n.AddNode(ctx, "b", 1, []int{0, 1}))
	assert.ElementsMatch(t, []string{n.BridgeNS(), n.NodeNS("a"), n.NodeNS("b")}, n.Leftovers())

	l, err := Listen(NSPath(n.NodeNS("a")), "tcp", net.JoinHostPort(NodeAddr(0).String(), "7000"))
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("from a"))
			c.Close()
		}
	}()
	for _, from := range []string{n.BridgeNS(), n.NodeNS("b")} {
		c, err := DialContext(ctx, NSPath(from), "tcp", l.Addr().String())
		require.NoError(t, err, "from %s", from)
		got, err := io.ReadAll(c)
		c.Close()
		require.NoError(t, err)
		assert.Equal(t, "from a", string(got), "from %s", from)
	}
	// Routes to the other node's pod range go through that node.
	out, err := exec.Command("ip", "-n", n.NodeNS("b"), "route", "get", "10.244.0.5").CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "via "+NodeAddr(0).String())

	// br0 keeps its address when a node's veth leaves it (nodes cache it for the gateway and
	// the API load balancer): without one set, a bridge takes its lowest port's.
	wantMAC, err := BridgeMAC(BridgeAddr)
	require.NoError(t, err)
	br0MAC := func() string {
		out, err := exec.Command("ip", "netns", "exec", n.BridgeNS(), "cat", "/sys/class/net/br0/address").CombinedOutput()
		require.NoError(t, err, "%s", out)
		return strings.TrimSpace(string(out))
	}
	assert.Equal(t, wantMAC, br0MAC())
	require.NoError(t, n.AddNode(ctx, "c", 2, []int{0, 1, 2}))
	require.NoError(t, n.DeleteNode(ctx, "c", 2))
	assert.Equal(t, wantMAC, br0MAC(), "after a node left")

	cg, err := NewCgroup("cmini-test-" + n.ID)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cg.Kill(context.Background()); _ = cg.Remove() })
	require.NoError(t, cg.Child("node").Create())
	sleep := exec.Command("sleep", "600")
	require.NoError(t, sleep.Start())
	go func() { _ = sleep.Wait() }()
	require.NoError(t, cg.Child("node").Add(sleep.Process.Pid))
	pids, err := cg.Pids()
	require.NoError(t, err)
	assert.Equal(t, []int{sleep.Process.Pid}, pids, "processes below the cgroup are found")
	require.NoError(t, cg.Kill(ctx))
	pids, err = cg.Pids()
	require.NoError(t, err)
	assert.Empty(t, pids)
	require.NoError(t, cg.Remove())
	assert.False(t, cg.Exists())

	require.NoError(t, n.Delete(ctx, []string{"a", "b"}))
	assert.Empty(t, n.Leftovers())
	_, err = os.Stat(NSPath(n.BridgeNS()))
	assert.True(t, os.IsNotExist(err))
}

// TestKillFrozen: the callback runs while every process of the cgroup is frozen and alive
// (a power cut kills the node's TPM then, before any of the node's processes can see it
// go), and afterwards none is left.
func TestKillFrozen(t *testing.T) {
	testtier.Integration(t, "cgroups, as root")
	idBytes := make([]byte, 3)
	_, _ = rand.Read(idBytes)
	cg, err := NewCgroup("cmini-test-" + hex.EncodeToString(idBytes))
	require.NoError(t, err)
	t.Cleanup(func() { _ = cg.Kill(context.Background()); _ = cg.Remove() })
	node := cg.Child("node")
	require.NoError(t, node.Create())
	var pids []int
	for range 2 {
		sleep := exec.Command("sleep", "600")
		require.NoError(t, sleep.Start())
		go func() { _ = sleep.Wait() }()
		require.NoError(t, node.Add(sleep.Process.Pid))
		pids = append(pids, sleep.Process.Pid)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	called := false
	require.NoError(t, node.KillFrozen(ctx, func() {
		called = true
		for _, pid := range pids {
			assert.NoError(t, syscall.Kill(pid, 0), "process %d is alive while the callback runs", pid)
		}
		state, err := os.ReadFile(filepath.Join(CgroupFS, "freezer", string(node), "freezer.state"))
		if err != nil {
			t.Logf("no freezer (%v): the callback runs right before the kill", err)
			return
		}
		assert.Contains(t, []string{"FROZEN\n", "FREEZING\n"}, string(state))
	}))
	assert.True(t, called)
	left, err := node.Pids()
	require.NoError(t, err)
	assert.Empty(t, left)
	assertThawed(t, node)

	// An empty cgroup (a machine that powered itself off) is thawed too: the node's next
	// boot starts its processes in it.
	require.NoError(t, node.KillFrozen(ctx, func() {}))
	assertThawed(t, node)
}

func assertThawed(t *testing.T, c Cgroup) {
	t.Helper()
	state, err := os.ReadFile(filepath.Join(CgroupFS, "freezer", string(c), "freezer.state"))
	if err != nil {
		return // no freezer
	}
	assert.Equal(t, "THAWED\n", string(state))
}
