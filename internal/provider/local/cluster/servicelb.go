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
// new token) is read again.
func (p *Provider) serveServiceLBs(ctx context.Context) {
	path := filepath.Join(p.spec.Dir, ServiceLBKubeconfigFile)
	bridge := sandbox.NSPath(p.net.BridgeNS())
	var modTime time.Time
	stop := func() {}
	defer func() { stop() }()
	for {
		if info, err := os.Stat(path); err == nil && !info.ModTime().Equal(modTime) {
			modTime = info.ModTime()
			// The old balancer goes first: the new one takes its ports (a port still held is
			// taken at its next round).
			stop()
			stop = func() {}
			if next, err := p.startServiceLBs(ctx, path, bridge); err != nil {
				p.log.Warn("service load balancers", "kubeconfig", path, "err", err)
			} else {
				stop = next
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(serviceLBWait):
		}
	}
}

// startServiceLBs starts a balancer with the kubeconfig at path; the returned func stops it.
func (p *Provider) startServiceLBs(ctx context.Context, path, bridge string) (func(), error) {
	client, err := serviceLBClient(path)
	if err != nil {
		return nil, err
	}
	lbCtx, cancel := context.WithCancel(ctx)
	b := hostlb.New(hostlb.Config{
		Client: client,
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return sandbox.DialContext(ctx, bridge, network, addr)
		},
		Nodes: p.runningNodeAddrs,
		Log:   p.log.With("component", "service-lb"),
	})
	go b.Run(lbCtx)
	p.log.Info("service load balancers started", "kubeconfig", path)
	return cancel, nil
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
