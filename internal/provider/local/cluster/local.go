package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/provider/local"
	"github.com/openconstellation/constellation/internal/provider/local/sandbox"
)

// Local is the CLI's side of the local provider: provider.Provider for the cluster whose
// provider process owns Dir. The provider process is started detached (it outlives the CLI
// command that started it) by running Exe with `mini provider <spec>`.
type Local struct {
	// Dir is the cluster's folder (workspace/mini).
	Dir string
	// Exe is the constellation binary that runs the provider process.
	Exe string
}

var (
	_ provider.Provider         = (*Local)(nil)
	_ provider.NodeShutdowner   = (*Local)(nil)
	_ provider.APIServerStopper = (*Local)(nil)
)

// AKCAFile in the cluster's folder is the certificate of the provider's AK CA, which
// certifies every node's attestation keys (written at create, kept until the cluster is
// removed).
const AKCAFile = "ak-ca.pem"

// Attestation implements provider.Provider: local nodes attest with local.Variant, their AKs
// certified by the cluster's AK CA.
func (l *Local) Attestation(context.Context) (provider.Attestation, error) {
	ca, err := os.ReadFile(filepath.Join(l.Dir, AKCAFile))
	if err != nil {
		return provider.Attestation{}, fmt.Errorf("the local provider's AK CA: %w", err)
	}
	return provider.Attestation{Variant: local.Variant, AKRootsPEM: ca}, nil
}

// Launch creates a new local cluster: it writes spec and starts its provider process, and
// returns once every node booted.
func Launch(ctx context.Context, exe string, spec Spec) (*Local, error) {
	if _, err := os.Stat(filepath.Join(spec.Dir, SpecFile)); err == nil {
		return nil, fmt.Errorf("%s has a local cluster already", spec.Dir)
	}
	for i := range spec.Nodes {
		spec.Nodes[i].Index = i
	}
	spec.NextIndex = len(spec.Nodes)
	if err := writeSpec(spec); err != nil {
		return nil, err
	}
	l := &Local{Dir: spec.Dir, Exe: exe}
	return l, l.startProcess(ctx)
}

// Running reports whether the cluster's provider process runs.
func (l *Local) Running() bool {
	s, err := ReadStatus(l.Dir)
	return err == nil && isProviderProcess(s.PID, l.Dir)
}

// startProcess starts the provider process and waits until it booted every node.
func (l *Local) startProcess(ctx context.Context) error {
	if l.Running() {
		return nil
	}
	logf, err := os.OpenFile(filepath.Join(l.Dir, "provider.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	_ = os.Remove(filepath.Join(l.Dir, StatusFile))
	cmd := exec.Command(l.Exe, "mini", "provider", filepath.Join(l.Dir, SpecFile))
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting the provider: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	for {
		if s, err := ReadStatus(l.Dir); err == nil && s.Ready {
			return nil
		}
		select {
		case err := <-exited:
			log, _ := os.ReadFile(filepath.Join(l.Dir, "provider.log"))
			return fmt.Errorf("the provider exited (%v) before the cluster was running: %s", err, tail(log, 2000))
		case <-ctx.Done():
			return fmt.Errorf("waiting for the provider: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Start starts a stopped cluster: the provider boots every node again from its kept folder.
func (l *Local) Start(ctx context.Context) error {
	if _, err := ReadSpec(l.Dir); err != nil {
		return err
	}
	return l.startProcess(ctx)
}

// Stop turns every node off, keeping their folders, and ends the provider process.
func (l *Local) Stop(ctx context.Context) error {
	s, err := ReadStatus(l.Dir)
	if err != nil || !isProviderProcess(s.PID, l.Dir) {
		return nil // already stopped
	}
	if err := l.call(ctx, http.MethodPost, "/v1/stop", nil, nil); err != nil {
		return err
	}
	return waitGone(ctx, s.PID, l.Dir)
}

// Destroy ends the provider process (which turns the nodes off) and removes whatever is left
// of the cluster: processes, namespaces, cgroups. The caller removes the folder.
func (l *Local) Destroy(ctx context.Context) error {
	var nodes []string
	if spec, err := ReadSpec(l.Dir); err == nil {
		for _, n := range spec.Nodes {
			nodes = append(nodes, n.Name)
		}
	}
	if s, err := ReadStatus(l.Dir); err == nil && isProviderProcess(s.PID, l.Dir) {
		if p, err := os.FindProcess(s.PID); err == nil {
			_ = p.Signal(syscall.SIGTERM)
			_ = waitGone(ctx, s.PID, l.Dir)
		}
	}
	return Remove(ctx, l.Dir, nodes)
}

// Nodes lists the nodes; a stopped cluster's nodes are listed from its spec as stopped.
func (l *Local) Nodes(ctx context.Context) ([]provider.Node, error) {
	if !l.Running() {
		spec, err := ReadSpec(l.Dir)
		if err != nil {
			return nil, err
		}
		var out []provider.Node
		for _, n := range spec.Nodes {
			out = append(out, provider.Node{NodeSpec: n.NodeSpec, IPs: []netip.Addr{sandbox.NodeAddr(n.Index)}, State: provider.Stopped})
		}
		return out, nil
	}
	var nodes []provider.Node
	if err := l.call(ctx, http.MethodGet, "/v1/nodes", nil, &nodes); err != nil {
		return nil, err
	}
	return nodes, nil
}

// CreateNodes creates and boots nodes in the running cluster.
func (l *Local) CreateNodes(ctx context.Context, specs []provider.NodeSpec) ([]provider.Node, error) {
	var nodes []provider.Node
	if err := l.call(ctx, http.MethodPost, "/v1/nodes", specs, &nodes); err != nil {
		return nil, fmt.Errorf("creating nodes: %w", err)
	}
	return nodes, nil
}

// LoadImages asks the provider to import archives of its LoadedImagesDir into every running
// node.
func (l *Local) LoadImages(ctx context.Context, archives []string) ([]provider.ImageLoad, error) {
	var loads []provider.ImageLoad
	if err := l.call(ctx, http.MethodPost, "/v1/images", LoadImagesRequest{Archives: archives}, &loads); err != nil {
		return nil, fmt.Errorf("loading images: %w", err)
	}
	return loads, nil
}

// RebootNode reboots a node.
func (l *Local) RebootNode(ctx context.Context, name string) error {
	if err := l.call(ctx, http.MethodPost, "/v1/nodes/"+name+"/reboot", nil, nil); err != nil {
		return fmt.Errorf("rebooting %s: %w", name, err)
	}
	return nil
}

// ShutdownNode implements provider.NodeShutdowner: the provider stops the node's API server
// and etcd gracefully, then powers it off; it stays off until RebootNode.
func (l *Local) ShutdownNode(ctx context.Context, name string) error {
	if err := l.call(ctx, http.MethodPost, "/v1/nodes/"+name+"/shutdown", nil, nil); err != nil {
		return fmt.Errorf("shutting %s down: %w", name, err)
	}
	return nil
}

// StopAPIServer implements provider.APIServerStopper: the provider drains the node's API
// server in the load balancer and stops it gracefully; etcd keeps running.
func (l *Local) StopAPIServer(ctx context.Context, name string) error {
	if err := l.call(ctx, http.MethodPost, "/v1/nodes/"+name+"/stop-api-server", nil, nil); err != nil {
		return fmt.Errorf("stopping the API server of %s: %w", name, err)
	}
	return nil
}

// PowerCutNode cuts a node's power and restores it (the provider's power cut): the node's
// processes and its TPM end at one instant, with no orderly TPM shutdown, and it boots again.
// It returns once the node booted. Not part of provider.Provider: a test of the platform's
// worst case, which clouds offer at most as a forced reset.
func (l *Local) PowerCutNode(ctx context.Context, name string) error {
	if err := l.call(ctx, http.MethodPost, "/v1/nodes/"+name+"/power-cut", nil, nil); err != nil {
		return fmt.Errorf("cutting the power of %s: %w", name, err)
	}
	return nil
}

// PowerCut cuts the power of the whole cluster, as a crash of the host does: every process
// of the cluster (the provider, every node's processes, every swtpm) is frozen and killed at
// one instant. No TPM gets TPM2_Shutdown, nothing is torn down, nothing in memory survives;
// the node folders keep what was written to them. What the provider would have removed
// (network namespaces, cgroups, its socket and status file) is left, as after a crash of the
// provider alone; the provider that Start runs removes it. PowerCut returns once the
// provider process is gone.
func (l *Local) PowerCut(ctx context.Context) error {
	s, err := ReadStatus(l.Dir)
	if err != nil || !isProviderProcess(s.PID, l.Dir) {
		return fmt.Errorf("%w: the local provider of %s does not run: nothing to cut", provider.ErrNotRunning, l.Dir)
	}
	cg, err := sandbox.NewCgroup("cmini-" + NetworkID(l.Dir))
	if err != nil {
		return err
	}
	if err := cg.Kill(ctx); err != nil {
		return fmt.Errorf("cutting the power of the cluster: %w", err)
	}
	return waitGone(ctx, s.PID, l.Dir)
}

// DeleteNode deletes a node and its disk.
func (l *Local) DeleteNode(ctx context.Context, name string) error {
	if err := l.call(ctx, http.MethodDelete, "/v1/nodes/"+name, nil, nil); err != nil {
		return fmt.Errorf("deleting %s: %w", name, err)
	}
	return nil
}

// Endpoints tells where the API server is forwarded on the host.
func (l *Local) Endpoints(ctx context.Context) (provider.Endpoints, error) {
	var e provider.Endpoints
	err := l.call(ctx, http.MethodGet, "/v1/endpoints", nil, &e)
	return e, err
}

// Dialer dials the cluster's private addresses from its bridge namespace: they exist nowhere
// else.
func (l *Local) Dialer() func(context.Context, string) (net.Conn, error) {
	bridge := sandbox.NSPath(sandbox.Network{ID: NetworkID(l.Dir)}.BridgeNS())
	return func(ctx context.Context, addr string) (net.Conn, error) {
		return sandbox.DialContext(ctx, bridge, "tcp", addr)
	}
}

// call makes one control API request; in and out are JSON (nil for none).
func (l *Local) call(ctx context.Context, method, path string, in, out any) error {
	if !l.Running() {
		return fmt.Errorf("%w: the local provider of %s does not run (start the cluster with 'constellation start')", provider.ErrNotRunning, l.Dir)
	}
	var body io.Reader
	if in != nil {
		data, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(data)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
	}
	sock := filepath.Join(l.Dir, SocketFile)
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
	}}
	req, err := http.NewRequestWithContext(ctx, method, "http://provider"+path, body)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("local provider %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return fmt.Errorf("local provider %s %s: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		msg := strings.TrimSpace(string(data))
		if resp.StatusCode == http.StatusNotFound {
			return fmt.Errorf("%w: %s", provider.ErrNoNode, msg)
		}
		return fmt.Errorf("local provider %s %s: %s: %s", method, path, resp.Status, msg)
	}
	if out != nil {
		// encoding/json, not strictjson: the answer of this program's own provider process.
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("local provider %s %s: %w", method, path, err)
		}
	}
	return nil
}

// isProviderProcess reports whether pid is the provider process of dir (not a reused PID, not
// a zombie).
func isProviderProcess(pid int, dir string) bool {
	if pid <= 0 {
		return false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if i := bytes.LastIndexByte(stat, ')'); i > 0 && bytes.HasPrefix(stat[i+1:], []byte(" Z")) {
		return false
	}
	return bytes.Contains(cmdline, []byte(dir))
}

func waitGone(ctx context.Context, pid int, dir string) error {
	for isProviderProcess(pid, dir) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the provider (pid %d) to end: %w", pid, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
