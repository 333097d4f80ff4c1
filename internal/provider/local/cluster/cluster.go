// Package cluster is the local provider at work: it creates a cluster's sandbox nodes (network,
// cgroup, swtpm, measured boot, certified AK, bootstrapper in fresh namespaces), serves their
// metadata, forwards the API server to the host's loopback, and removes all of it again.
// It runs in a long-lived provider process (`constellation mini provider`), the "cloud" of
// the local cluster: swtpm processes are its children and die with it.
package cluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/openconstellation/constellation/internal/attestation/akca"
	"github.com/openconstellation/constellation/internal/fileutil"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider/local"
	"github.com/openconstellation/constellation/internal/provider/local/metaserver"
	"github.com/openconstellation/constellation/internal/provider/local/sandbox"
	"github.com/openconstellation/constellation/internal/swtpm"
)

// Ports (docs/local-provider.md).
const (
	MetadataPort  = 8080
	InitPort      = 9000
	APIServerPort = 6443
	JoinPort      = 30090
)

// NodeSpec is one node to create.
type NodeSpec struct {
	Name string `json:"name"`
	Role string `json:"role"` // metadata.ControlPlane or metadata.Worker
	// ImageDir is the node image it boots (bootstrapper, kubelet, kubeadm, containerd.toml,
	// node-config.json).
	ImageDir string `json:"imageDir"`
	// Unexpected marks a node that is not expected to be admitted (tests: a node booting an
	// image that differs from the reference values); the CLI reports it instead of
	// waiting for it.
	Unexpected bool `json:"unexpected,omitempty"`
}

// Spec is a cluster to create.
type Spec struct {
	// Dir is the folder the provider owns (workspace/mini).
	Dir    string     `json:"dir"`
	Nodes  []NodeSpec `json:"nodes"`
	Images []string   `json:"images"` // container image tarballs every node imports
	// InitSecretHash is the bcrypt hash of the CLI's init secret.
	InitSecretHash string `json:"initSecretHash"`
	// AKCACert and AKCAKey (PEM files) certify the nodes' AKs.
	AKCACert string `json:"akCACert"`
	AKCAKey  string `json:"akCAKey"`
}

// Status is what the provider publishes in Dir/provider.json for the CLI and `mini down`.
type Status struct {
	PID       int          `json:"pid"`
	NetworkID string       `json:"networkID"`
	Cgroup    string       `json:"cgroup"`
	APIServer string       `json:"apiServer"` // host loopback address forwarding to the API server
	Nodes     []NodeStatus `json:"nodes"`
	Ready     bool         `json:"ready"` // every node booted its bootstrapper
}

// NodeStatus is one created node.
type NodeStatus struct {
	NodeSpec
	IP      string `json:"ip"`
	NetNS   string `json:"netns"`
	Cgroup  string `json:"cgroup"`
	LogFile string `json:"logFile"`
}

// StatusFile is the status path below Spec.Dir.
const StatusFile = "provider.json"

// ReadStatus reads the provider status of dir.
func ReadStatus(dir string) (Status, error) {
	var s Status
	data, err := os.ReadFile(filepath.Join(dir, StatusFile))
	if err != nil {
		return s, err
	}
	if err := json.Unmarshal(data, &s); err != nil {
		return s, fmt.Errorf("reading %s: %w", filepath.Join(dir, StatusFile), err)
	}
	return s, nil
}

// NetworkID derives the short ID of a cluster's namespaces from its folder.
func NetworkID(dir string) string {
	abs, _ := filepath.Abs(dir)
	sum := sha256.Sum256([]byte(abs))
	return hex.EncodeToString(sum[:3])
}

// Provider runs one cluster.
type Provider struct {
	spec   Spec
	log    *slog.Logger
	net    sandbox.Network
	cgroup sandbox.Cgroup
	status Status
	tpms   []*swtpm.Process
}

// Serve creates the cluster and serves it until ctx ends, then removes it.
func Serve(ctx context.Context, spec Spec, log *slog.Logger) (retErr error) {
	id := NetworkID(spec.Dir)
	cg, err := sandbox.NewCgroup("cmini-" + id)
	if err != nil {
		return err
	}
	// Orphans of the nodes (daemonized containerd shims, and everything once a node is
	// killed) are re-parented to the provider, which reaps them: the machine's PID 1 may not.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("becoming the nodes' subreaper: %w", err)
	}
	go reapOrphans(ctx)
	defer reapAll()
	p := &Provider{spec: spec, log: log, net: sandbox.Network{ID: id}, cgroup: cg}
	p.status = Status{PID: os.Getpid(), NetworkID: id, Cgroup: string(cg)}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := p.teardown(cctx); err != nil {
			log.Error("teardown", "err", err)
			retErr = errors.Join(retErr, err)
		}
	}()
	if err := p.create(ctx); err != nil {
		p.writeStatus()
		return err
	}
	<-ctx.Done()
	return nil
}

func (p *Provider) create(ctx context.Context) error {
	if err := p.cgroup.Create(); err != nil {
		return err
	}
	if err := p.cgroup.Child("provider").Create(); err != nil {
		return err
	}
	// The provider and its swtpms in the cluster's cgroup: `mini down` finds them all.
	if err := p.cgroup.Child("provider").Add(os.Getpid()); err != nil {
		return err
	}
	if err := p.net.CreateBridge(ctx); err != nil {
		return err
	}
	var all []int
	for i := range p.spec.Nodes {
		all = append(all, i)
	}
	var metaNodes []metaserver.Node
	var joinEndpoints []string
	for i, n := range p.spec.Nodes {
		if err := p.net.AddNode(ctx, n.Name, i, all); err != nil {
			return fmt.Errorf("network of %s: %w", n.Name, err)
		}
		ip := sandbox.NodeAddr(i)
		p.status.Nodes = append(p.status.Nodes, NodeStatus{
			NodeSpec: n, IP: ip.String(), NetNS: sandbox.NSPath(p.net.NodeNS(n.Name)),
			Cgroup:  string(p.cgroup.Child(n.Name)),
			LogFile: filepath.Join(p.spec.Dir, "nodes", n.Name, "logs", "bootstrapper.log"),
		})
		metaNodes = append(metaNodes, metaserver.Node{
			Name: n.Name, Role: n.Role, IPs: []netip.Addr{ip}, PodCIDR: sandbox.NodePodCIDR(i),
			CgroupRoot: string(p.cgroup.Child(n.Name).Child("pods")),
		})
		if n.Role == "control-plane" {
			joinEndpoints = append(joinEndpoints, net.JoinHostPort(ip.String(), fmt.Sprint(JoinPort)))
		}
	}
	meta := metaserver.New(metaNodes, joinEndpoints, []byte(p.spec.InitSecretHash))
	ml, err := sandbox.Listen(sandbox.NSPath(p.net.BridgeNS()), "tcp", net.JoinHostPort(sandbox.BridgeAddr.String(), fmt.Sprint(MetadataPort)))
	if err != nil {
		return fmt.Errorf("metadata service: %w", err)
	}
	go func() { _ = (&http.Server{Handler: meta.Handler(), ReadHeaderTimeout: 5 * time.Second}).Serve(ml) }()

	if err := p.forwardAPIServer(ctx); err != nil {
		return err
	}
	ca, err := loadCA(p.spec.AKCACert, p.spec.AKCAKey)
	if err != nil {
		return err
	}
	for i, n := range p.spec.Nodes {
		if err := p.startNode(ctx, i, n, ca); err != nil {
			return fmt.Errorf("starting %s: %w", n.Name, err)
		}
	}
	p.status.Ready = true
	p.writeStatus()
	p.log.Info("cluster created", "nodes", len(p.spec.Nodes), "apiServer", p.status.APIServer)
	return nil
}

// startNode plays firmware and hardware for node i: its swtpm, the measured boot of its
// image, the certified AK, then its bootstrapper in new mount and UTS namespaces inside its
// network namespace and cgroup.
func (p *Provider) startNode(ctx context.Context, i int, n NodeSpec, ca *akca.CA) error {
	dir := filepath.Join(p.spec.Dir, "nodes", n.Name)
	for _, d := range []string{"tpm", "logs", "state"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return err
		}
	}
	tpmProc, err := swtpm.Start(ctx, swtpm.Options{StateDir: filepath.Join(dir, "tpm")})
	if err != nil {
		return err
	}
	p.tpms = append(p.tpms, tpmProc)
	image, err := local.ImageComponents(n.ImageDir)
	if err != nil {
		return err
	}
	tpm, err := tpmProc.Open(ctx)
	if err != nil {
		return err
	}
	err = local.Measure(tpm, image)
	if err == nil {
		err = local.CertifyAK(tpm, ca, n.Name, metadata.Role(n.Role), time.Now())
	}
	if err == nil {
		err = local.LockPlatform(tpm)
	}
	tpm.Close()
	if err != nil {
		return err
	}
	cg := p.cgroup.Child(n.Name)
	if err := cg.Create(); err != nil {
		return err
	}
	if err := cg.Child("pods").Create(); err != nil {
		return err
	}
	procs, err := cg.Procs()
	if err != nil {
		return err
	}
	args := []string{"--node-dir", dir, "--image-dir", n.ImageDir}
	for _, img := range p.spec.Images {
		args = append(args, "--image", img)
	}
	// The launcher puts itself into the node's cgroup before it execs into the node's
	// namespaces, so nothing the node starts escapes the cgroup.
	script := `for f in ` + strings.Join(procs, " ") + `; do echo $$ > "$f" || exit 1; done; exec "$@"`
	cmdArgs := append([]string{"-c", script, "launch", "nsenter", "--net=" + sandbox.NSPath(p.net.NodeNS(n.Name)), "--",
		"unshare", "--mount", "--uts", "--propagation", "private", "--", filepath.Join(n.ImageDir, "bootstrapper")}, args...)
	logf, err := os.OpenFile(filepath.Join(dir, "logs", "bootstrapper.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command("sh", cmdArgs...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return err
	}
	go func() { _ = cmd.Wait() }() // reap
	p.log.Info("node started", "node", n.Name, "pid", cmd.Process.Pid, "ip", sandbox.NodeAddr(i))
	return nil
}

// forwardAPIServer forwards a host loopback port to the control planes' API servers, so
// kubectl on the host reaches the cluster.
func (p *Provider) forwardAPIServer(ctx context.Context) error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("API server forward: %w", err)
	}
	p.status.APIServer = l.Addr().String()
	var targets []string
	for _, n := range p.status.Nodes {
		if n.Role == "control-plane" {
			targets = append(targets, net.JoinHostPort(n.IP, fmt.Sprint(APIServerPort)))
		}
	}
	bridge := sandbox.NSPath(p.net.BridgeNS())
	go func() {
		<-ctx.Done()
		l.Close()
	}()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go forward(ctx, c, bridge, targets)
		}
	}()
	return nil
}

func forward(ctx context.Context, c net.Conn, nsPath string, targets []string) {
	defer c.Close()
	for _, t := range targets {
		dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		up, err := sandbox.DialContext(dctx, nsPath, "tcp", t)
		cancel()
		if err != nil {
			continue
		}
		defer up.Close()
		done := make(chan struct{}, 2)
		go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
		go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
		<-done
		return
	}
}

func (p *Provider) writeStatus() {
	data, _ := json.MarshalIndent(p.status, "", "  ")
	if err := fileutil.WriteAtomic(filepath.Join(p.spec.Dir, StatusFile), append(data, '\n'), 0o644); err != nil {
		p.log.Error("writing status", "err", err)
	}
}

func (p *Provider) teardown(ctx context.Context) error {
	var errs []error
	for _, n := range p.spec.Nodes {
		if err := p.cgroup.Child(n.Name).Kill(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	for _, t := range p.tpms {
		if err := t.Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	var names []string
	for _, n := range p.spec.Nodes {
		names = append(names, n.Name)
	}
	if err := p.net.Delete(ctx, names); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Remove removes whatever of a cluster in dir is left (its provider gone or stuck): every
// process in its cgroup, its namespaces and its cgroups.
func Remove(ctx context.Context, dir string, nodes []string) error {
	id := NetworkID(dir)
	cg, err := sandbox.NewCgroup("cmini-" + id)
	if err != nil {
		return err
	}
	var errs []error
	if err := cg.Kill(ctx); err != nil {
		errs = append(errs, err)
	}
	n := sandbox.Network{ID: id}
	if err := n.Delete(ctx, nodes); err != nil {
		errs = append(errs, err)
	}
	if err := cg.Remove(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func loadCA(certFile, keyFile string) (*akca.CA, error) {
	cert, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("reading the AK CA: %w", err)
	}
	key, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("reading the AK CA: %w", err)
	}
	return akca.Load(cert, key)
}

// reapOrphans collects exited orphans while the cluster runs. Only processes that have
// exited are collected; a child started with os/exec whose status is taken here sees
// ECHILD from Wait, which the provider treats as exited.
func reapOrphans(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(2 * time.Second):
		}
		reapAll()
	}
}

func reapAll() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
