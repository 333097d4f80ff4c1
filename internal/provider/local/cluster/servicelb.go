package cluster

import (
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider/local/hostlb"
	"github.com/openconstellation/constellation/internal/provider/local/sandbox"
)

// ServiceLBKubeconfigFile, in the provider's folder, is the kubeconfig the CLI writes for the
// Service load balancers (provider.ServiceLoadBalancer): a token that may only read Services
// and write their status.
const ServiceLBKubeconfigFile = "service-lb.kubeconfig"

// serviceLBWait is how often the provider looks for the kubeconfig before the cluster is
// initialized.
const serviceLBWait = 2 * time.Second

// serveServiceLBs runs the host's load balancers for NodePort and LoadBalancer Services
// (hostlb) once the CLI wrote their kubeconfig, until ctx ends. A kubeconfig written again (a
// new token, at every apply) is read again and handed to the running balancer, whose ports stay
// open: a connection to a Service is never refused because apply ran.
func (p *Provider) serveServiceLBs(ctx context.Context) {
	path := filepath.Join(p.spec.Dir, ServiceLBKubeconfigFile)
	bridge := sandbox.NSPath(p.net.BridgeNS())
	var modTime time.Time
	var balancer *hostlb.Balancer
	for {
		if info, err := os.Stat(path); err == nil && !info.ModTime().Equal(modTime) {
			modTime = info.ModTime()
			client, err := serviceLBClient(path)
			switch {
			case err != nil:
				p.log.Warn("service load balancers", "kubeconfig", path, "err", err)
			case balancer == nil:
				balancer = p.startServiceLBs(ctx, client, bridge)
				p.log.Info("service load balancers started", "kubeconfig", path)
			default:
				balancer.SetClient(client)
				p.log.Info("service load balancers use a new credential", "kubeconfig", path)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(serviceLBWait):
		}
	}
}

// startServiceLBs starts a balancer acting with client until ctx ends.
func (p *Provider) startServiceLBs(ctx context.Context, client kubernetes.Interface, bridge string) *hostlb.Balancer {
	b := hostlb.New(hostlb.Config{
		Client: client,
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return sandbox.DialContext(ctx, bridge, network, addr)
		},
		Nodes: p.runningNodeAddrs,
		Log:   p.log.With("component", "service-lb"),
	})
	go b.Run(ctx)
	return b
}

func serviceLBClient(path string) (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, err
	}
	cfg.Timeout = 10 * time.Second
	return kubernetes.NewForConfig(cfg)
}

// runningNodeAddrs are the addresses of the nodes whose boot runs, workers first (control
// planes carry the cluster's own load).
func (p *Provider) runningNodeAddrs() []netip.Addr {
	p.mu.Lock()
	defer p.mu.Unlock()
	var workers, controlPlanes []netip.Addr
	for _, n := range p.sortedLocked() {
		if n.exited == nil || n.off || n.ending {
			continue
		}
		if n.spec.Role == metadata.Worker {
			workers = append(workers, sandbox.NodeAddr(n.spec.Index))
		} else {
			controlPlanes = append(controlPlanes, sandbox.NodeAddr(n.spec.Index))
		}
	}
	return append(workers, controlPlanes...)
}
