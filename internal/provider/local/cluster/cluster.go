// Package cluster is the local provider at work: it creates a cluster's sandbox nodes (network,
// cgroup, swtpm, measured boot, certified AK, bootstrapper in fresh namespaces), serves their
// metadata, forwards the API server to the host's loopback, reboots, adds and deletes nodes,
// and stops or removes all of it again. It runs in a long-lived provider process
// (`constellation mini provider`), the "cloud" of the local cluster: swtpm processes are its
// children and die with it. The CLI talks to it through Local (provider.Provider) over a unix
// socket in the cluster's folder, as it would talk to a cloud's API.
//
// A node's boot is what a machine's boot is: a fresh swtpm power cycle (PCRs reset, NV kept),
// the provider playing firmware (measure the image, certify the AKs, lock the platform
// hierarchy), a fresh network namespace, and the bootstrapper in new mount and UTS
// namespaces. Only the node's folder survives a reboot: its encrypted state, its TPM's NV and
// its logs, as a disk, a TPM and a serial console do.
//
// A power cut (of a node, through the control API, or of the whole cluster with the provider,
// Local.PowerCut) is a reboot without any warning: the node's processes and its swtpm are
// killed at one instant, and nothing in memory survives.
//
// The provider is also the machine's watchdog: a node whose bootstrapper exits (the
// bootstrapper exits when the node's kubelet dies after the node joined, see nodeboot) is
// rebooted, and the event is recorded and shown in the node's provider view. A node that fails
// again and again right after booting is marked failed instead of being rebooted forever.
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
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/openconstellation/constellation/internal/attestation/akca"
	"github.com/openconstellation/constellation/internal/fileutil"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/nodeimage"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/provider/local"
	"github.com/openconstellation/constellation/internal/provider/local/apilb"
	"github.com/openconstellation/constellation/internal/provider/local/metaserver"
	"github.com/openconstellation/constellation/internal/provider/local/sandbox"
	"github.com/openconstellation/constellation/internal/provider/local/volumestore"
	"github.com/openconstellation/constellation/internal/reaper"
	"github.com/openconstellation/constellation/pkg/untrusted"
)

// Ports (docs/local-provider.md).
const (
	MetadataPort  = 8080
	InitPort      = provider.InitPort
	APIServerPort = 6443
	JoinPort      = provider.JoinPort
)

// NodeSpec is one node of the cluster with the provider's slot for it: its index fixes its
// address and pod range, and is never given to another node.
type NodeSpec struct {
	provider.NodeSpec
	Index int `json:"index"`
}

// Spec is a cluster. The CLI writes it when it creates the cluster; from then on the
// provider keeps it up to date (nodes added and deleted), so a stopped cluster starts again
// with the nodes it had.
type Spec struct {
	// Dir is the folder the provider owns (workspace/mini).
	Dir   string     `json:"dir"`
	Nodes []NodeSpec `json:"nodes"`
	// ImagesDir holds the container image archives and their index (make images). Each node
	// imports the images of the Kubernetes version its image's node-config.json names and ours
	// (nodeimage.Index.ForKubernetes), read at each of its boots.
	ImagesDir string `json:"imagesDir,omitempty"`
	// Images are archives every node imports, in a spec an earlier CLI wrote (which had no
	// ImagesDir).
	Images []string `json:"images,omitempty"`
	// InitSecretHash is the bcrypt hash of the CLI's init secret.
	InitSecretHash string `json:"initSecretHash"`
	// AKCACert and AKCAKey (PEM files) certify the nodes' AKs.
	AKCACert string `json:"akCACert"`
	AKCAKey  string `json:"akCAKey"`
	// APIServerPort is the host loopback port forwarding to the API servers: 0 picks one at
	// creation, which is kept for later starts (the admin kubeconfig names it).
	APIServerPort int `json:"apiServerPort,omitempty"`
	// NextIndex is the next free node index: indexes (and names) are never reused.
	NextIndex int `json:"nextIndex"`
	// NAT, when set, gives the nodes their way out (network.outbound nat): the bridge
	// namespace's uplink (sandbox.Uplink), which forwards and masquerades. Nil: the nodes
	// reach nothing outside the cluster (network.outbound none, or a spec written before NAT).
	NAT *NATSpec `json:"nat,omitempty"`
	// Machines is the kind of the nodes' machines ("" for sandboxes), one registered with
	// RegisterMachines; MachineShape is its configuration, the kind's own JSON.
	Machines     string          `json:"machines,omitempty"`
	MachineShape json.RawMessage `json:"machineShape,omitempty"`
}

// NATSpec configures a cluster's NAT.
type NATSpec struct {
	// HostLoopback lets the nodes reach the host's 127.0.0.1 at sandbox.UplinkGateway
	// (network.hostLoopback).
	HostLoopback bool `json:"hostLoopback,omitempty"`
}

// SpecFile is the spec's path below Spec.Dir.
const SpecFile = "spec.json"

// ReadSpec reads the spec of the cluster in dir.
func ReadSpec(dir string) (Spec, error) {
	var s Spec
	data, err := os.ReadFile(filepath.Join(dir, SpecFile))
	if err != nil {
		return s, fmt.Errorf("reading the local cluster's spec: %w", err)
	}
	// encoding/json, not strictjson: this program's own output (writeSpec).
	if err := json.Unmarshal(data, &s); err != nil {
		return s, fmt.Errorf("reading %s: %w", filepath.Join(dir, SpecFile), err)
	}
	return s, nil
}

func writeSpec(s Spec) error {
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return fileutil.WriteAtomic(filepath.Join(s.Dir, SpecFile), append(data, '\n'), 0o600)
}

// Status is what the provider publishes in Dir/provider.json for the CLI and `mini down`:
// how to find the running provider process.
type Status struct {
	PID       int    `json:"pid"`
	NetworkID string `json:"networkID"`
	Cgroup    string `json:"cgroup"`
	APIServer string `json:"apiServer"` // host loopback front of the API load balancer
	// ClusterAPIServer is the load balancer's address in the cluster network (APIEndpoint).
	ClusterAPIServer string `json:"clusterAPIServer"`
	// Nodes are the nodes as created (tests and diagnosis; the CLI asks Local.Nodes).
	Nodes []NodeStatus `json:"nodes"`
	Ready bool         `json:"ready"` // every node booted its bootstrapper
}

// NodeStatus is one created node.
type NodeStatus struct {
	Name       string `json:"name"`
	Role       string `json:"role"`
	ImageDir   string `json:"imageDir"`
	Unexpected bool   `json:"unexpected,omitempty"`
	IP         string `json:"ip"`
	NetNS      string `json:"netns"`
	Cgroup     string `json:"cgroup"`
	LogFile    string `json:"logFile"`
}

// StatusFile is the status path below Spec.Dir; SocketFile the control API's socket;
// VolumesDir the movable volumes' storage (volumestore), outside every node's folder.
const (
	StatusFile = "provider.json"
	SocketFile = "provider.sock"
	VolumesDir = "volumes"
)

// ReadStatus reads the provider status of dir.
func ReadStatus(dir string) (Status, error) {
	var s Status
	data, err := os.ReadFile(filepath.Join(dir, StatusFile))
	if err != nil {
		return s, err
	}
	// encoding/json, not strictjson: the provider process's own output for the CLI.
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

// Watchdog limits: a node that fails within crashWindow of booting crashLimit times in a row
// is marked failed and left off, instead of being rebooted in a loop.
const (
	crashWindow = 2 * time.Minute
	crashLimit  = 5
	maxEvents   = 20
)

// Provider runs one cluster.
type Provider struct {
	log    *slog.Logger
	net    sandbox.Network
	cgroup sandbox.Cgroup
	// machines are the nodes' hardware: sandboxes or virtual machines.
	machines Machines
	ca       *akca.CA
	meta     *metaserver.Server
	lb       *apilb.Balancer
	// volumes are the movable volumes, served by the metadata service's volume API.
	volumes *volumestore.Store
	// ctx is the provider's lifetime; stop ends it keeping the nodes' folders.
	ctx    context.Context
	stop   context.CancelFunc
	status Status
	// reapWarn warns once that orphans cannot be reaped.
	reapWarn sync.Once
	// newMachines makes machines once the cluster's network and AK CA exist.
	newMachines NewMachines

	mu     sync.Mutex // guards spec, nodes, uplink and the status file
	spec   Spec
	nodes  map[string]*node
	uplink *sandbox.Uplink // nil without NAT
}

// node is one node's machine.
type node struct {
	spec NodeSpec
	// ops serializes boots, reboots and deletion of this node.
	ops sync.Mutex

	// guarded by Provider.mu:
	power    Power         // this boot's machine; nil while off
	exited   chan struct{} // closed when this boot's machine (the sandbox's bootstrapper) exited
	ending   bool          // the provider is ending this boot (reboot, delete, stop)
	off      bool          // this boot ended: the node's processes are gone
	state    provider.NodeState
	detail   string
	boots    int
	pid      int // this boot's main process (Power.PID)
	bootedAt time.Time
	crashes  int // failures within crashWindow of boot, in a row
	events   []provider.Event
}

// Serve creates the cluster's network and boots its nodes (new ones, or the nodes of a stopped
// cluster with their kept state), and serves it until ctx ends or Stop is asked for; then it
// turns everything off. Node folders are kept: `mini down` (Remove) deletes them.
func Serve(ctx context.Context, spec Spec, log *slog.Logger) error {
	newMachines, err := machinesOf(spec)
	if err != nil {
		return err
	}
	return ServeMachines(ctx, spec, log, newMachines)
}

// ServeMachines is Serve with the nodes on the machines newMachines makes.
func ServeMachines(ctx context.Context, spec Spec, log *slog.Logger, newMachines NewMachines) (retErr error) {
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
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	p := &Provider{spec: spec, log: log, net: sandbox.Network{ID: id}, cgroup: cg, nodes: map[string]*node{}, ctx: ctx, stop: stop}
	p.status = Status{PID: os.Getpid(), NetworkID: id, Cgroup: string(cg)}
	p.newMachines = newMachines
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := p.teardown(cctx); err != nil {
			log.Error("teardown", "err", err)
			retErr = errors.Join(retErr, err)
		}
		p.reapAll()
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
	go p.reapOrphans(ctx)
	if err := p.createNetwork(ctx); err != nil {
		return err
	}
	ca, err := loadCA(p.spec.AKCACert, p.spec.AKCAKey)
	if err != nil {
		return err
	}
	p.ca = ca
	if p.machines, err = p.newMachines(MachineEnv{Net: p.net, Cgroup: p.cgroup, CA: ca, Dir: p.spec.Dir, Log: p.log}); err != nil {
		return err
	}
	p.meta = metaserver.New(nil, nil, []byte(p.spec.InitSecretHash))
	p.meta.SetAPIEndpoint(APIEndpoint())
	if err := p.openVolumes(); err != nil {
		return err
	}
	ml, err := sandbox.Listen(sandbox.NSPath(p.net.BridgeNS()), "tcp", net.JoinHostPort(sandbox.BridgeAddr.String(), fmt.Sprint(MetadataPort)))
	if err != nil {
		return fmt.Errorf("metadata service: %w", err)
	}
	go func() { _ = (&http.Server{Handler: p.meta.Handler(), ReadHeaderTimeout: 5 * time.Second}).Serve(ml) }()
	go func() {
		<-ctx.Done()
		ml.Close()
	}()
	if err := p.serveAPIEndpoint(ctx); err != nil {
		return err
	}
	for _, n := range p.spec.Nodes {
		p.nodes[n.Name] = &node{spec: n, state: provider.Booting}
	}
	p.publish()
	// Boot in parallel: each boot is mostly waiting for swtpm and process start-up.
	errs := make(chan error, len(p.spec.Nodes))
	for _, n := range p.spec.Nodes {
		nd := p.nodes[n.Name]
		go func() { errs <- p.boot(nd, "created") }()
	}
	var bootErrs []error
	for range p.spec.Nodes {
		if err := <-errs; err != nil {
			bootErrs = append(bootErrs, err)
		}
	}
	if err := errors.Join(bootErrs...); err != nil {
		return err
	}
	if err := p.serveAPI(ctx); err != nil {
		return err
	}
	go p.serveServiceLBs(ctx)
	p.mu.Lock()
	p.status.Ready = true
	p.writeStatus()
	p.mu.Unlock()
	p.log.Info("cluster running", "nodes", len(p.spec.Nodes), "apiServer", p.status.APIServer)
	return nil
}

// createNetwork makes the cluster's private network afresh (a provider that died without
// tearing down leaves namespaces behind) and, with NAT, its uplink, kept running.
func (p *Provider) createNetwork(ctx context.Context) error {
	var names []string
	for _, n := range p.spec.Nodes {
		names = append(names, n.Name)
	}
	if err := p.net.Delete(ctx, names); err != nil {
		return err
	}
	if err := p.net.CreateBridge(ctx); err != nil {
		return err
	}
	if p.spec.NAT == nil {
		return nil
	}
	u, err := p.startUplink(ctx)
	if err != nil {
		return err
	}
	go p.keepUplink(ctx, u)
	return nil
}

// startUplink starts the bridge namespace's uplink and makes it the provider's.
func (p *Provider) startUplink(ctx context.Context) (*sandbox.Uplink, error) {
	u, err := p.net.StartUplink(ctx, p.spec.NAT.HostLoopback)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.uplink = u
	p.mu.Unlock()
	return u, nil
}

// keepUplink starts the uplink again whenever it exits while the cluster runs (slirp4netns
// ending is the host's network cable pulled: the nodes lose their way out until it is back),
// with a back-off of 1 s doubling to 30 s, until ctx ends.
func (p *Provider) keepUplink(ctx context.Context, u *sandbox.Uplink) {
	backoff := time.Second
	for {
		select {
		case <-ctx.Done():
			return
		case <-u.Done():
		}
		u.Stop() // releases its exit pipe
		p.log.Warn("uplink exited; starting it again", "err", u.Err(), "in", backoff)
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			next, err := p.startUplink(ctx)
			if err == nil {
				u, backoff = next, time.Second
				p.log.Info("uplink running again", "pid", next.PID())
				break
			}
			backoff = min(2*backoff, 30*time.Second)
			p.log.Warn("uplink did not start", "err", err, "retry in", backoff)
		}
	}
}

// publish gives the metadata service the current node list and join endpoints, and writes
// the status file. Call with p.mu not held.
func (p *Provider) publish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	var metaNodes []metaserver.Node
	var joinEndpoints []string
	var st []NodeStatus
	for _, n := range p.sortedLocked() {
		ip := sandbox.NodeAddr(n.spec.Index)
		cgroupRoot, netns := p.machines.Describe(n.spec.Name)
		metaNodes = append(metaNodes, metaserver.Node{
			Name: n.spec.Name, Role: string(n.spec.Role), IPs: []netip.Addr{ip}, PodCIDR: sandbox.NodePodCIDR(n.spec.Index),
			CgroupRoot: cgroupRoot,
		})
		if n.spec.Role == metadata.ControlPlane {
			joinEndpoints = append(joinEndpoints, net.JoinHostPort(ip.String(), fmt.Sprint(JoinPort)))
		}
		st = append(st, NodeStatus{
			Name: n.spec.Name, Role: string(n.spec.Role), ImageDir: n.spec.Image, Unexpected: n.spec.Unexpected,
			IP: ip.String(), NetNS: netns, Cgroup: string(p.cgroup.Child(n.spec.Name)),
			LogFile: filepath.Join(p.nodeDir(n.spec.Name), "logs", "bootstrapper.log"),
		})
	}
	p.meta.SetNodes(metaNodes, joinEndpoints)
	p.status.Nodes = st
	p.writeStatus()
}

func (p *Provider) sortedLocked() []*node {
	out := make([]*node, 0, len(p.nodes))
	for _, n := range p.nodes {
		out = append(out, n)
	}
	slices.SortFunc(out, func(a, b *node) int { return a.spec.Index - b.spec.Index })
	return out
}

func (p *Provider) nodeDir(name string) string { return filepath.Join(p.spec.Dir, "nodes", name) }

// event records something that happened to n, in its events and the provider's log.
func (p *Provider) event(n *node, msg string) {
	p.mu.Lock()
	n.events = append(n.events, provider.Event{Time: time.Now().UTC(), Message: msg})
	if len(n.events) > maxEvents {
		n.events = n.events[len(n.events)-maxEvents:]
	}
	p.mu.Unlock()
	p.log.Info("node event", "node", n.spec.Name, "event", msg)
}

func (p *Provider) setState(n *node, s provider.NodeState, detail string) {
	p.mu.Lock()
	n.state, n.detail = s, detail
	p.mu.Unlock()
}

// boot powers node n on: network, swtpm power cycle, measured boot, certified AK, locked
// platform hierarchy, then the bootstrapper in the node's namespaces and cgroup. why goes
// into the node's events.
func (p *Provider) boot(n *node, why string) error {
	n.ops.Lock()
	defer n.ops.Unlock()
	return p.bootLocked(n, why)
}

// bootLocked boots n with n.ops held, in the order a machine powers on:
//
//  1. the node's directories, and a new network namespace (a machine's network stack is
//     new at every boot);
//  2. its swtpm, power-cycled, with the image measured, the AK certified and the platform
//     hierarchy locked (firmware's part);
//  3. its cgroup and the bootstrapper in the node's namespaces;
//  4. the watchers of the bootstrapper and the swtpm.
//
// A failure marks the node failed, with an event.
func (p *Provider) bootLocked(n *node, why string) (retErr error) {
	ctx := p.ctx
	if ctx.Err() != nil {
		return fmt.Errorf("booting %s: %w", n.spec.Name, provider.ErrNotRunning)
	}
	p.setState(n, provider.Booting, why)
	defer func() {
		if retErr != nil {
			p.setState(n, provider.Failed, retErr.Error())
			p.event(n, "boot failed: "+retErr.Error())
		}
	}()
	m, err := p.prepareNode(n)
	if err != nil {
		return err
	}
	p.meta.ClearReport(n.spec.Name)
	power, err := p.machines.Boot(ctx, m)
	if err != nil {
		return err
	}
	exited := make(chan struct{})
	p.mu.Lock()
	n.power = power
	n.exited, n.ending, n.off = exited, false, false
	n.boots++
	n.pid = power.PID()
	n.bootedAt = time.Now().UTC()
	n.state, n.detail = provider.Running, ""
	boot := n.boots
	p.updateLBLocked()
	p.mu.Unlock()
	p.event(n, "booted ("+why+")")
	go p.watch(n, power, exited, boot)
	go p.watchTPM(n, power, boot)
	p.log.Info("node started", "node", n.spec.Name, "pid", power.PID(), "ip", sandbox.NodeAddr(n.spec.Index))
	return nil
}

// prepareNode makes n's directories and returns what its machine needs to boot.
func (p *Provider) prepareNode(n *node) (Machine, error) {
	dir := p.nodeDir(n.spec.Name)
	for _, d := range []string{"tpm", "logs", "state"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return Machine{}, err
		}
	}
	p.mu.Lock()
	var peers []int
	for _, o := range p.nodes {
		peers = append(peers, o.spec.Index)
	}
	p.mu.Unlock()
	images, err := p.nodeImages(n.spec.NodeSpec)
	if err != nil {
		return Machine{}, err
	}
	return Machine{NodeSpec: n.spec, Dir: dir, Peers: peers, Images: images, LoadedImagesDir: p.loadedImagesDir()}, nil
}

// nodeImages returns the container image archives node imports: those of its node
// configuration's Kubernetes version and of its further versions, and ours.
func (p *Provider) nodeImages(node provider.NodeSpec) ([]string, error) {
	if p.spec.ImagesDir == "" {
		return p.spec.Images, nil
	}
	return NodeImages(p.spec.ImagesDir, node.Image, node.Role, node.KubernetesVersions...)
}

// NodeImages returns the archives a node of role booting the node image in imageDir imports:
// from the image index in imagesDir the images of the Kubernetes version its node-config.json
// names and of the further versions, and ours (nodeimage.Index.ForKubernetes), a worker's
// without the control plane's (nodeimage.Index.ForWorker); and those the node image carries
// (local.ImageArchives: a release's services image).
func NodeImages(imagesDir, imageDir string, role metadata.Role, further ...string) ([]string, error) {
	data, err := os.ReadFile(filepath.Join(imageDir, local.NodeConfigFile))
	if err != nil {
		return nil, fmt.Errorf("node image: %w", err)
	}
	nodeConfig, err := local.ParseNodeConfig(data)
	if err != nil {
		return nil, fmt.Errorf("node image %s: %w", imageDir, err)
	}
	index, err := nodeimage.ReadIndex(imagesDir)
	if err != nil {
		return nil, err
	}
	images, err := index.ForKubernetes(append([]string{nodeConfig.KubernetesVersion}, further...)...)
	if err != nil {
		return nil, fmt.Errorf("container images of node image %s: %w", imageDir, err)
	}
	if role != metadata.ControlPlane {
		images = images.ForWorker()
	}
	carried, err := local.ImageArchives(imageDir)
	if err != nil {
		return nil, fmt.Errorf("container images of node image %s: %w", imageDir, err)
	}
	return append(images.Files(imagesDir), carried...), nil
}

// watch waits for a boot's bootstrapper to exit. An exit the provider did not cause is a
// node failure: the node is rebooted, unless it keeps failing right after booting.
func (p *Provider) watch(n *node, power Power, exited chan struct{}, boot int) {
	<-power.Exited()
	err := power.ExitErr()
	p.mu.Lock()
	close(exited)
	failed := p.claimFailureLocked(n, boot)
	p.mu.Unlock()
	if !failed {
		return
	}
	why := "bootstrapper exited"
	if err != nil {
		why += " (" + err.Error() + ")"
	}
	p.failed(n, why)
}

// watchTPM waits for a boot's swtpm to exit. The provider plays the node's hardware, and a
// swtpm that exits while the node runs is its TPM chip failing: nothing on the node can
// attest or unseal any more, and nothing on the node can repair that, so it is a node failure
// as a bootstrapper's exit is. A real machine's watchdog (or its operator) would
// power-cycle it; here the power cycle starts a new swtpm on the TPM's kept state, as a reset
// brings a TPM back, and the node rejoins.
func (p *Provider) watchTPM(n *node, power Power, boot int) {
	select {
	case <-power.TPMExited():
	case <-p.ctx.Done():
		return
	}
	p.mu.Lock()
	failed := p.claimFailureLocked(n, boot)
	p.mu.Unlock()
	if !failed {
		return
	}
	why := "TPM failed (swtpm exited"
	if err := power.TPMExitErr(); err != nil {
		why += ": " + err.Error()
	}
	p.failed(n, why+")")
}

// claimFailureLocked reports whether a failure seen by a watcher of boot is for it to handle:
// not when the provider itself is ending that boot (reboot, power cut, deletion, stop), nor
// when the boot is over or another watcher of it already claimed a failure (the bootstrapper
// and the TPM of one boot can fail together: the node is rebooted once). Call with p.mu held.
func (p *Provider) claimFailureLocked(n *node, boot int) bool {
	if n.ending || n.boots != boot || p.ctx.Err() != nil {
		return false
	}
	// The boot is ending now: the reboot below powers it off.
	n.ending = true
	p.updateLBLocked()
	return true
}

// failed handles a node failure a watcher claimed: it records an event naming the failure
// (and the last line of the node's log) and reboots the node, or leaves it off when it failed
// crashLimit times in a row within crashWindow of booting.
func (p *Provider) failed(n *node, why string) {
	p.mu.Lock()
	sinceBoot := time.Since(n.bootedAt)
	if sinceBoot < crashWindow {
		n.crashes++
	} else {
		n.crashes = 1
	}
	crashes := n.crashes
	p.mu.Unlock()
	why += fmt.Sprintf(" after %s", sinceBoot.Round(time.Second))
	if tail := lastLogLine(filepath.Join(p.nodeDir(n.spec.Name), "logs", "bootstrapper.log")); tail != "" {
		why += ": " + tail
	}
	if crashes >= crashLimit {
		p.event(n, why+fmt.Sprintf("; %d failures in a row within %s of booting: left off", crashes, crashWindow))
		n.ops.Lock()
		p.powerOff(n)
		n.ops.Unlock()
		p.setState(n, provider.Failed, why)
		return
	}
	p.event(n, why+": rebooting")
	if err := p.reboot(n, "watchdog: "+why, reset); err != nil {
		p.log.Error("reboot after failure", "node", n.spec.Name, "err", err)
	}
}

// reboot powers n off and on again, keeping its folder. A requested reboot shuts the node
// down gracefully first (shutdownGracefully), as a soft reboot of a machine does; the
// watchdog's reboot of a failed node is a reset.
func (p *Provider) reboot(n *node, why string, how powerOffMode) error {
	n.ops.Lock()
	defer n.ops.Unlock()
	p.setState(n, provider.Rebooting, why)
	if err := p.powerOffHow(n, how); err != nil {
		p.setState(n, provider.Failed, err.Error())
		return err
	}
	return p.bootLocked(n, why)
}

// powerCut cuts n's power and restores it: every process of the node and its swtpm end at
// one instant (SIGKILL while the node is frozen: the TPM gets no TPM2_Shutdown and may be
// in the middle of a command), its network namespace goes, and so does everything only in
// memory, its tmpfs among it (the node's mount namespace ends with its last process). Then
// the node boots, as a machine set to power on when power returns. Only what the node wrote
// to its folder survives, as on a disk.
func (p *Provider) powerCut(n *node) error {
	n.ops.Lock()
	defer n.ops.Unlock()
	p.setState(n, provider.Rebooting, "power cut")
	if err := p.powerOffHow(n, cut); err != nil {
		p.setState(n, provider.Failed, err.Error())
		return err
	}
	return p.bootLocked(n, "power restored after a power cut")
}

// powerOffMode is how a boot ends.
type powerOffMode int

const (
	// reset kills the node's processes, then stops its swtpm.
	reset powerOffMode = iota
	// cut kills the swtpm with the node's processes, at one instant (a power cut).
	cut
	// graceful stops the node's control-plane processes in order first (shutdownGracefully),
	// then is a reset.
	graceful
)

// powerOff ends n's current boot: every process of the node, its swtpm and its network
// namespace. Its folder (disk, TPM state, logs) stays. Call with n.ops held.
func (p *Provider) powerOff(n *node) error { return p.powerOffHow(n, reset) }

// powerOffHow is powerOff the way how says. None sends the TPM TPM2_Shutdown: the node's
// processes are killed, so no OS shutdown says goodbye to the TPM, and for the TPM each is
// a power loss (docs/node-lifecycle.md, "Power loss and the TPM"). From its start the node's
// API server is draining in the load balancer, and once the node is off it is none of its
// backends.
func (p *Provider) powerOffHow(n *node, how powerOffMode) error {
	p.mu.Lock()
	n.ending = true
	exited, power := n.exited, n.power
	n.power = nil
	running := exited != nil && !n.off
	p.updateLBLocked()
	p.mu.Unlock()
	if how == graceful && running {
		p.shutdownGracefully(n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var errs []error
	var whileFrozen func()
	if how == cut && power != nil {
		whileFrozen = func() { _ = power.KillTPM() }
	}
	if err := p.cgroup.Child(n.spec.Name).KillFrozen(ctx, whileFrozen); err != nil {
		errs = append(errs, err)
	}
	if exited != nil {
		select {
		case <-exited:
		case <-ctx.Done():
			errs = append(errs, fmt.Errorf("the bootstrapper of %s did not exit", n.spec.Name))
		}
	}
	if power != nil {
		if err := power.StopTPM(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := p.machines.Detach(ctx, n.spec.Name, n.spec.Index); err != nil {
		errs = append(errs, err)
	}
	p.meta.ClearReport(n.spec.Name)
	p.mu.Lock()
	n.off = true
	p.updateLBLocked()
	p.mu.Unlock()
	return errors.Join(errs...)
}

// shutdown powers n off gracefully and leaves it off, with its folder, as a machine that was
// shut down: a reboot boots it again.
func (p *Provider) shutdown(n *node) error {
	n.ops.Lock()
	defer n.ops.Unlock()
	if err := p.powerOffHow(n, graceful); err != nil {
		p.setState(n, provider.Failed, err.Error())
		return err
	}
	p.setState(n, provider.Stopped, "shut down")
	return nil
}

// shutdownAll shuts every node down gracefully (shutdown), all at once, as a cluster's
// operator stops its machines: a machine's OS unmounts its state disk, a sandbox's API
// servers and etcd stop in order. What a node's shutdown leaves running, the teardown after
// it kills.
func (p *Provider) shutdownAll() {
	p.mu.Lock()
	nodes := p.sortedLocked()
	p.mu.Unlock()
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := p.shutdown(n); err != nil {
				p.log.Warn("graceful stop", "node", n.spec.Name, "err", err)
			}
		}()
	}
	wg.Wait()
}

// addNodes creates and boots new nodes.
func (p *Provider) addNodes(specs []provider.NodeSpec) ([]NodeSpec, error) {
	p.mu.Lock()
	var added []*node
	var problems []error
	for _, s := range specs {
		if _, ok := p.nodes[s.Name]; ok || slices.ContainsFunc(p.spec.Nodes, func(n NodeSpec) bool { return n.Name == s.Name }) {
			problems = append(problems, fmt.Errorf("node %s exists", s.Name))
			continue
		}
		if !s.Role.Valid() {
			problems = append(problems, fmt.Errorf("node %s: role %q", s.Name, s.Role))
			continue
		}
		// A node whose images are not all there would fail at every boot: refuse it now.
		if _, err := p.nodeImages(s); err != nil {
			problems = append(problems, fmt.Errorf("node %s: %w", s.Name, err))
			continue
		}
		if p.spec.NextIndex >= sandbox.MaxNodes {
			problems = append(problems, fmt.Errorf("node %s: the local provider has no address left (%d nodes were created)", s.Name, sandbox.MaxNodes))
			continue
		}
		ns := NodeSpec{NodeSpec: s, Index: p.spec.NextIndex}
		p.spec.NextIndex++
		n := &node{spec: ns, state: provider.Booting}
		p.nodes[s.Name] = n
		p.spec.Nodes = append(p.spec.Nodes, ns)
		added = append(added, n)
	}
	err := writeSpec(p.spec)
	p.mu.Unlock()
	if err := errors.Join(append(problems, err)...); err != nil {
		return nil, err
	}
	// The other nodes route to the new nodes' pod ranges.
	for _, n := range added {
		if err := p.routeToAll(n.spec.Index, true); err != nil {
			return nil, err
		}
	}
	p.publish()
	var out []NodeSpec
	var errs []error
	for _, n := range added {
		if err := p.boot(n, "created"); err != nil {
			errs = append(errs, fmt.Errorf("booting %s: %w", n.spec.Name, err))
		}
		out = append(out, n.spec)
	}
	return out, errors.Join(errs...)
}

// routeToAll adds (or removes) the route to node index i's pod range on every other node.
func (p *Provider) routeToAll(i int, add bool) error {
	p.mu.Lock()
	var others []NodeSpec
	for _, o := range p.nodes {
		if o.spec.Index != i && o.exited != nil {
			others = append(others, o.spec)
		}
	}
	p.mu.Unlock()
	var errs []error
	for _, o := range others {
		if err := p.machines.Route(p.ctx, o.Name, i, add); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// deleteNode powers a node off and removes it, its folder and its slot; the metadata service
// stops listing it, so the join service refuses it from then on.
func (p *Provider) deleteNode(name string) error {
	p.mu.Lock()
	n, ok := p.nodes[name]
	p.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %s", provider.ErrNoNode, name)
	}
	n.ops.Lock()
	defer n.ops.Unlock()
	if err := p.powerOffHow(n, graceful); err != nil {
		return err
	}
	if err := p.cgroup.Child(name).Remove(); err != nil {
		return err
	}
	p.mu.Lock()
	delete(p.nodes, name)
	p.updateLBLocked()
	p.spec.Nodes = slices.DeleteFunc(p.spec.Nodes, func(s NodeSpec) bool { return s.Name == name })
	err := writeSpec(p.spec)
	p.mu.Unlock()
	if err != nil {
		return err
	}
	p.publish()
	// Unlisted first (no attach to it succeeds from now on), then its volumes released, as a
	// cloud detaches a deleted machine's disks. A failure here is released at the provider's
	// next start (openVolumes).
	if err := p.volumes.DetachNode(name); err != nil {
		p.log.Error("releasing the volumes of a deleted node", "node", name, "err", err)
	}
	if err := p.routeToAll(n.spec.Index, false); err != nil {
		p.log.Warn("removing routes to a deleted node", "node", name, "err", err)
	}
	// The disk goes with the machine.
	if err := os.RemoveAll(p.nodeDir(name)); err != nil {
		return fmt.Errorf("removing the disk of %s: %w", name, err)
	}
	p.log.Info("node deleted", "node", name)
	return nil
}

// openVolumes opens the cluster's volume storage (Dir/volumes), releases the attachments of
// nodes the cluster no longer has (a provider killed while deleting a node), and serves it
// through the metadata service.
func (p *Provider) openVolumes() error {
	dir, err := filepath.Abs(filepath.Join(p.spec.Dir, VolumesDir))
	if err != nil {
		return err
	}
	store, err := volumestore.Open(dir)
	if err != nil {
		return err
	}
	var names []string
	for _, n := range p.spec.Nodes {
		names = append(names, n.Name)
	}
	if err := store.DetachNodesExcept(names); err != nil {
		return fmt.Errorf("releasing the volumes of deleted nodes: %w", err)
	}
	p.volumes = store
	if disks, ok := p.machines.(VolumeDisks); ok {
		p.meta.SetVolumes(&pluggedVolumes{Store: store, disks: disks})
	} else {
		p.meta.SetVolumes(store)
	}
	return nil
}

// view is the provider.Node of n.
func (p *Provider) view(n *node) provider.Node {
	p.mu.Lock()
	defer p.mu.Unlock()
	rep := p.meta.Report(n.spec.Name)
	return provider.Node{
		NodeSpec: n.spec.NodeSpec, IPs: []netip.Addr{sandbox.NodeAddr(n.spec.Index)},
		State: n.state, Detail: n.detail, Reported: rep.Phase, ReportedDetail: rep.Detail,
		Boots: n.boots, BootedAt: n.bootedAt, Events: slices.Clone(n.events),
	}
}

func (p *Provider) views() []provider.Node {
	p.mu.Lock()
	nodes := p.sortedLocked()
	p.mu.Unlock()
	out := make([]provider.Node, 0, len(nodes))
	for _, n := range nodes {
		out = append(out, p.view(n))
	}
	return out
}

// writeStatus writes the status file. Call with p.mu held.
func (p *Provider) writeStatus() {
	data, _ := json.MarshalIndent(p.status, "", "  ")
	if err := fileutil.WriteAtomic(filepath.Join(p.spec.Dir, StatusFile), append(data, '\n'), 0o644); err != nil {
		p.log.Error("writing status", "err", err)
	}
}

// teardown turns every node off and removes the network; node folders stay.
func (p *Provider) teardown(ctx context.Context) error {
	var errs []error
	p.mu.Lock()
	nodes := p.sortedLocked()
	p.mu.Unlock()
	var names []string
	for _, n := range nodes {
		names = append(names, n.spec.Name)
		p.mu.Lock()
		n.ending = true
		p.mu.Unlock()
	}
	// Node by node: the cluster's cgroup also holds the provider itself, which must not
	// freeze or kill itself.
	for _, n := range nodes {
		if err := p.cgroup.Child(n.spec.Name).Kill(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	for _, n := range nodes {
		p.mu.Lock()
		power := n.power
		n.power = nil
		n.state = provider.Stopped
		p.mu.Unlock()
		if power != nil {
			if err := power.StopTPM(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	p.mu.Lock()
	uplink := p.uplink
	p.uplink = nil
	p.mu.Unlock()
	if uplink != nil {
		uplink.Stop()
	}
	if p.machines != nil {
		p.machines.Close()
	}
	if err := p.net.Delete(ctx, names); err != nil {
		errs = append(errs, err)
	}
	_ = os.Remove(filepath.Join(p.spec.Dir, SocketFile))
	_ = os.Remove(filepath.Join(p.spec.Dir, StatusFile))
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

// lastLogLine returns the message of the last line of a node's JSON log, for events.
func lastLogLine(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return ""
	}
	const window = 4096
	off := max(info.Size()-window, 0)
	buf := make([]byte, info.Size()-off)
	if _, err := f.ReadAt(buf, off); err != nil && !errors.Is(err, io.EOF) {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(string(buf)), "\n")
	last := lines[len(lines)-1]
	// The node writes this file: its last line is the node's text (JSON strings decode to
	// any bytes), and it reaches the operator's terminal through `constellation status`.
	// encoding/json, not strictjson: the line is only shown (escaped), nothing is decided on
	// it, and slog's "msg" and "err" are matched to Msg and Err ignoring case.
	var rec struct{ Msg, Err string }
	if json.Unmarshal([]byte(last), &rec) == nil && rec.Msg != "" {
		if rec.Err != "" {
			return untrusted.Text(rec.Msg + ": " + rec.Err)
		}
		return untrusted.Text(rec.Msg)
	}
	return untrusted.Text(last)
}

// reapOrphans collects exited orphans while the cluster runs: never a child the provider
// started itself, whose exec.Cmd waits for it (reaper.Reap).
func (p *Provider) reapOrphans(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(2 * time.Second):
		}
		p.reapAll()
	}
}

func (p *Provider) reapAll() {
	if _, err := reaper.Reap(); err != nil {
		p.reapWarn.Do(func() { p.log.Warn("orphans of the nodes stay zombies until the provider exits", "err", err) })
	}
}
