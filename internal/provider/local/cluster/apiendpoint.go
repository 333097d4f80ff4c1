package cluster

import (
	"context"
	"fmt"
	"net"
	"syscall"
	"time"

	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider/local/apilb"
	"github.com/openconstellation/constellation/internal/provider/local/sandbox"
)

// APIEndpoint is the cluster's stable API server endpoint: the provider's load balancer at
// sandbox.APIAddr in the bridge namespace (docs/local-provider.md). kubeadm's
// controlPlaneEndpoint, and with it every kubeconfig of the cluster, names it.
func APIEndpoint() string {
	return net.JoinHostPort(sandbox.APIAddr.String(), fmt.Sprint(APIServerPort))
}

// serveAPIEndpoint starts the API load balancer: its backends are dialed and health-checked
// from the bridge namespace, and it serves two fronts: APIEndpoint for the nodes, and a host
// loopback port for the CLI and kubectl (the admin kubeconfig names it; the port is kept
// across starts). Both fronts end with ctx.
func (p *Provider) serveAPIEndpoint(ctx context.Context) error {
	bridge := sandbox.NSPath(p.net.BridgeNS())
	p.lb = apilb.New(apilb.Config{
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return sandbox.DialContext(ctx, bridge, network, addr)
		},
		Log: p.log.With("component", "apilb"),
	})
	inCluster, err := sandbox.Listen(bridge, "tcp", APIEndpoint())
	if err != nil {
		return fmt.Errorf("API load balancer on %s: %w", APIEndpoint(), err)
	}
	addr := "127.0.0.1:0"
	if p.spec.APIServerPort != 0 {
		addr = net.JoinHostPort("127.0.0.1", fmt.Sprint(p.spec.APIServerPort))
	}
	host, err := net.Listen("tcp", addr)
	if err != nil {
		inCluster.Close()
		return fmt.Errorf("API load balancer on the host's %s: %w", addr, err)
	}
	p.status.APIServer = host.Addr().String()
	p.status.ClusterAPIServer = APIEndpoint()
	if p.spec.APIServerPort == 0 {
		p.spec.APIServerPort = host.Addr().(*net.TCPAddr).Port
		if err := writeSpec(p.spec); err != nil {
			inCluster.Close()
			host.Close()
			return err
		}
	}
	for _, l := range []net.Listener{inCluster, host} {
		go func() {
			if err := p.lb.Serve(l); err != nil {
				p.log.Error("API load balancer", "listener", l.Addr().String(), "err", err)
			}
		}()
	}
	go func() {
		<-ctx.Done()
		inCluster.Close()
		host.Close()
		p.lb.Close()
	}()
	return nil
}

// updateLBLocked gives the load balancer the control planes from the provider's node list: a
// node whose boot runs is a backend, draining while the provider ends that boot (reboot,
// shutdown, deletion, a watchdog's reboot), and gone once it is off. Call with p.mu held,
// after every change of a node's boot.
func (p *Provider) updateLBLocked() {
	if p.lb == nil {
		return
	}
	var backends []apilb.Backend
	for _, n := range p.sortedLocked() {
		if n.spec.Role != metadata.ControlPlane || n.exited == nil || n.off {
			continue
		}
		addr := net.JoinHostPort(sandbox.NodeAddr(n.spec.Index).String(), fmt.Sprint(APIServerPort))
		backends = append(backends, apilb.Backend{Addr: addr, Draining: n.ending})
	}
	p.lb.Update(backends)
}

// Bounds of a graceful shutdown's steps; what is still running after them is killed. The API
// server stops listening and sends GOAWAY at once, and finishes its short requests within
// milliseconds; what keeps it longer are its watches, which it would hold for a minute
// (its shutdown timeout) and which its clients start again elsewhere anyway.
const (
	apiServerStopBound = 3 * time.Second
	etcdStopBound      = 10 * time.Second
)

// shutdownStep stops one process of a node: the signal, and how long it may take to exit
// before it is killed (0: not waited for).
type shutdownStep struct {
	comm  string
	sig   syscall.Signal
	bound time.Duration
}

// shutdownSteps is the order in which a graceful shutdown stops a node's control-plane
// processes before the power goes.
var shutdownSteps = []shutdownStep{
	// The kubelet is frozen first: it would restart a static pod's container that exits at
	// once, and its exit ends the bootstrapper.
	{"kubelet", syscall.SIGSTOP, 0},
	// The API server stops serving: its readiness fails, it finishes the requests it has and
	// sends its HTTP/2 clients GOAWAY, so they retry elsewhere, on a fresh connection through
	// the load balancer, which no longer sends anything here (draining).
	{"kube-apiserver", syscall.SIGTERM, apiServerStopBound},
	// etcd after its API server (which needs it for the requests it finishes): a leader hands
	// its leadership over before it stops, so the others elect no one after a timeout.
	{"etcd", syscall.SIGTERM, etcdStopBound},
}

// shutdownGracefully stops node n's control-plane processes in order (shutdownSteps), as
// the node's OS would stop its services at a shutdown: the local node's OS, the bootstrapper,
// has no shutdown of its own, and every other process of the node is killed right after by
// the power-off anyway. A step that runs out of time is logged, and the power-off kills what
// is left. Workers have none of these but the kubelet.
func (p *Provider) shutdownGracefully(n *node) { p.machines.Shutdown(n.spec.Name) }

// stopAPIServer stops n's API server gracefully and leaves etcd running (the first steps of
// shutdownGracefully: the kubelet frozen, the API server stopped), with n draining in the load
// balancer from the start. n is leaving the cluster (provider.APIServerStopper): its etcd
// member is removed next, then the node is deleted.
func (p *Provider) stopAPIServer(n *node) error {
	n.ops.Lock()
	defer n.ops.Unlock()
	p.mu.Lock()
	running := n.exited != nil && !n.off
	if running {
		n.ending = true
		p.updateLBLocked()
	}
	p.mu.Unlock()
	if running {
		return p.machines.StopAPIServer(n.spec.Name)
	}
	return nil
}
