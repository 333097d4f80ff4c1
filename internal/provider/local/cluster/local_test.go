package cluster

import (
	"errors"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/pkg/untrusted"
)

// A stopped cluster (no provider process) is still listed, from its spec, as stopped; every
// call that needs the running platform says the cluster is not running.
func TestLocalStopped(t *testing.T) {
	dir := t.TempDir()
	spec := Spec{Dir: dir, NextIndex: 4, Nodes: []NodeSpec{
		{NodeSpec: provider.NodeSpec{Name: "control-plane-0", Role: metadata.ControlPlane, Image: "/image"}, Index: 0},
		{NodeSpec: provider.NodeSpec{Name: "worker-3", Role: metadata.Worker, Image: "/image"}, Index: 3},
	}}
	require.NoError(t, writeSpec(spec))
	l := &Local{Dir: dir, Exe: "/nonexistent"}
	assert.False(t, l.Running())

	nodes, err := l.Nodes(t.Context())
	require.NoError(t, err)
	require.Len(t, nodes, 2)
	assert.Equal(t, provider.Node{NodeSpec: spec.Nodes[1].NodeSpec, IPs: []netip.Addr{netip.MustParseAddr("10.42.0.13")}, State: provider.Stopped}, nodes[1],
		"the address follows the node's slot, not its position")

	for name, call := range map[string]func() error{
		"reboot":    func() error { return l.RebootNode(t.Context(), "worker-3") },
		"delete":    func() error { return l.DeleteNode(t.Context(), "worker-3") },
		"create":    func() error { _, err := l.CreateNodes(t.Context(), nil); return err },
		"endpoints": func() error { _, err := l.Endpoints(t.Context()); return err },
		"power cut": func() error { return l.PowerCutNode(t.Context(), "worker-3") },
		// Nothing runs, so nothing to cut: not a silent success.
		"power cut of the cluster": func() error { return l.PowerCut(t.Context()) },
	} {
		err := call()
		assert.True(t, errors.Is(err, provider.ErrNotRunning), "%s: %v", name, err)
	}
	assert.NoError(t, l.Stop(t.Context()), "stopping a stopped cluster is a no-op")

	_, err = Launch(t.Context(), "/nonexistent", spec)
	assert.ErrorContains(t, err, "has a local cluster already")
}

func TestLastLogLine(t *testing.T) {
	dir := t.TempDir()
	path := dir + "/log"
	assert.Empty(t, lastLogLine(path), "no log")
	require.NoError(t, writeFile(path, `{"msg":"first"}`+"\n"+`{"msg":"bootstrapper failed","err":"node failed: kubelet exited"}`+"\n"))
	assert.Equal(t, "bootstrapper failed: node failed: kubelet exited", lastLogLine(path))
	require.NoError(t, writeFile(path, "plain text line\n"))
	assert.Equal(t, "plain text line", lastLogLine(path))

	// A compromised node writes its log file: what it puts there reaches `constellation
	// status` one bounded line without control characters.
	hostile := strings.Repeat(`\u001b[2J\u001b]0;pwned\u0007\r`, 50)
	require.NoError(t, writeFile(path, `{"msg":"`+hostile+`","err":"`+hostile+`"}`+"\n"))
	got := lastLogLine(path)
	assert.LessOrEqual(t, len(got), untrusted.MaxTextBytes+32)
	assert.NotContains(t, got, "\x1b")
	assert.NotContains(t, got, "\a")
	assert.NotContains(t, got, "\r")
	assert.Contains(t, got, `\x1b[2J`)
	require.NoError(t, writeFile(path, strings.Repeat("\x1b[2J\r", 1000)+"\n"))
	assert.NotContains(t, lastLogLine(path), "\x1b")
}

func writeFile(path, content string) error { return os.WriteFile(path, []byte(content), 0o600) }
