// Package hostlb makes the local cluster's Services reachable from the host, as a cloud's
// load balancer controller (or cloud-provider-kind for kind) does: the local provider runs it
// with a kubeconfig that may only read Services and write their status.
//
//   - A LoadBalancer Service gets an address of the host's loopback network, 127.0.<a>.<b>
//     (Linux routes all of 127.0.0.0/8 to lo, so no address is added to any interface):
//     each of its TCP ports listens there, and the address is written to the Service's
//     status.loadBalancer.ingress, where kubectl shows it as EXTERNAL-IP.
//   - Every NodePort (of a NodePort or LoadBalancer Service) listens on 127.0.0.1:<nodePort>,
//     as kind's port mappings would.
//
// A connection is forwarded, as bytes, to the node port on a running node, trying the nodes
// in turn (kube-proxy on any node reaches the Service's ready pods). UDP ports are not
// forwarded. A port the host already uses is logged and left out.
package hostlb

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/openconstellation/constellation/internal/netpipe"
)

// Config configures a Balancer.
type Config struct {
	// Client reads Services and writes their status; SetClient replaces it.
	Client kubernetes.Interface
	// Dial connects to a node address from the cluster network.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Nodes returns the addresses of the nodes that run, in the order to try them.
	Nodes func() []netip.Addr
	// Interval between reconciliations; default 2 s.
	Interval time.Duration
	// Pool is the first LoadBalancer address; default 127.0.42.1. Addresses are taken in
	// order from it, skipping those another process uses.
	Pool netip.Addr
	Log  *slog.Logger
}

// Balancer forwards host ports to the cluster's Services.
type Balancer struct {
	cfg Config

	mu        sync.Mutex
	listeners map[netip.AddrPort]*forward
	client    kubernetes.Interface // guarded by mu
}

// forward is one host port and the node port it forwards to.
type forward struct {
	ln       net.Listener
	nodePort int32
	service  string
}

// New returns a balancer; Run starts it.
func New(cfg Config) *Balancer {
	if cfg.Interval <= 0 {
		cfg.Interval = 2 * time.Second
	}
	if !cfg.Pool.IsValid() {
		cfg.Pool = netip.MustParseAddr("127.0.42.1")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Balancer{cfg: cfg, listeners: map[netip.AddrPort]*forward{}, client: cfg.Client}
}

// SetClient makes the balancer act on the cluster with client from its next reconciliation
// on: a new credential (the CLI issues one at every apply) changes nothing else. The ports
// stay open: a balancer started anew for it would close them, and every connection to them
// would be refused until it opened them again (BenchmarkUpgrade counted such a refusal).
func (b *Balancer) SetClient(client kubernetes.Interface) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.client = client
}

func (b *Balancer) currentClient() kubernetes.Interface {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.client
}

// Run reconciles until ctx ends, then closes every listener.
func (b *Balancer) Run(ctx context.Context) {
	defer b.closeAll()
	for {
		if err := b.Reconcile(ctx); err != nil && ctx.Err() == nil {
			b.cfg.Log.Warn("service load balancers", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(b.cfg.Interval):
		}
	}
}

// want is one host port a Service should have.
type want struct {
	addr     netip.AddrPort
	nodePort int32
	service  string
}

// Reconcile lists the Services once, opens and closes host ports to match, and writes the
// LoadBalancer addresses into the Services' status.
func (b *Balancer) Reconcile(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	client := b.currentClient()
	list, err := client.CoreV1().Services(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing services: %w", err)
	}
	services := list.Items
	sort.Slice(services, func(i, j int) bool { return key(&services[i]) < key(&services[j]) })
	var wants []want
	var errs []error
	for i := range services {
		svc := &services[i]
		if svc.Spec.Type != corev1.ServiceTypeNodePort && svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
			continue
		}
		for _, p := range svc.Spec.Ports {
			if p.Protocol == corev1.ProtocolTCP && p.NodePort != 0 {
				wants = append(wants, want{netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(p.NodePort)), p.NodePort, key(svc)})
			}
		}
		if svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
			lb, err := b.loadBalancer(ctx, client, svc)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			wants = append(wants, lb...)
		}
	}
	b.apply(wants)
	return errors.Join(errs...)
}

// loadBalancer returns the host ports of a LoadBalancer Service at its address (the one in
// its status if that is still ours, else the next free one of the pool), and writes the
// address to its status.
func (b *Balancer) loadBalancer(ctx context.Context, client kubernetes.Interface, svc *corev1.Service) ([]want, error) {
	var ports []corev1.ServicePort
	for _, p := range svc.Spec.Ports {
		if p.Protocol == corev1.ProtocolTCP && p.NodePort != 0 {
			ports = append(ports, p)
		}
	}
	if len(ports) == 0 {
		return nil, nil
	}
	addr, ok := b.currentAddress(svc, ports)
	if !ok {
		var err error
		if addr, err = b.freeAddress(ports); err != nil {
			return nil, fmt.Errorf("service %s: %w", key(svc), err)
		}
	}
	var out []want
	for _, p := range ports {
		out = append(out, want{netip.AddrPortFrom(addr, uint16(p.Port)), p.NodePort, key(svc)})
	}
	ingress := []corev1.LoadBalancerIngress{{IP: addr.String()}}
	if len(svc.Status.LoadBalancer.Ingress) != 1 || svc.Status.LoadBalancer.Ingress[0].IP != addr.String() {
		updated := svc.DeepCopy()
		updated.Status.LoadBalancer.Ingress = ingress
		if _, err := client.CoreV1().Services(svc.Namespace).UpdateStatus(ctx, updated, metav1.UpdateOptions{}); err != nil {
			return out, fmt.Errorf("service %s: writing its address %s: %w", key(svc), addr, err)
		}
		b.cfg.Log.Info("load balancer address", "service", key(svc), "address", addr.String())
	}
	return out, nil
}

// currentAddress is the address the Service's status names, if it is one of the pool's and
// its ports are ours or free.
func (b *Balancer) currentAddress(svc *corev1.Service, ports []corev1.ServicePort) (netip.Addr, bool) {
	if len(svc.Status.LoadBalancer.Ingress) != 1 {
		return netip.Addr{}, false
	}
	addr, err := netip.ParseAddr(svc.Status.LoadBalancer.Ingress[0].IP)
	if err != nil || !b.inPool(addr) {
		return netip.Addr{}, false
	}
	return addr, b.usable(addr, ports, key(svc))
}

func (b *Balancer) inPool(a netip.Addr) bool {
	return a.Is4() && a.As4()[0] == 127 && a.As4()[1] == b.cfg.Pool.As4()[1] && !a.Less(b.cfg.Pool)
}

// usable reports whether every port of addr is this Service's already or free to listen on.
func (b *Balancer) usable(addr netip.Addr, ports []corev1.ServicePort, service string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, p := range ports {
		ap := netip.AddrPortFrom(addr, uint16(p.Port))
		if f, ok := b.listeners[ap]; ok {
			if f.service != service {
				return false
			}
			continue
		}
		ln, err := net.Listen("tcp", ap.String())
		if err != nil {
			return false
		}
		ln.Close()
	}
	return true
}

// freeAddress is the first address of the pool that no Service of ours has and whose ports
// are free.
func (b *Balancer) freeAddress(ports []corev1.ServicePort) (netip.Addr, error) {
	taken := map[netip.Addr]bool{}
	b.mu.Lock()
	for ap := range b.listeners {
		taken[ap.Addr()] = true
	}
	b.mu.Unlock()
	for a, i := b.cfg.Pool, 0; i < 4096 && b.inPool(a); a, i = a.Next(), i+1 {
		if !taken[a] && a.As4()[3] != 0 && a.As4()[3] != 255 && b.usable(a, ports, "") {
			return a, nil
		}
	}
	return netip.Addr{}, errors.New("no free address in the host's load balancer pool")
}

// apply opens the host ports of wants that are not open and closes those no Service wants.
func (b *Balancer) apply(wants []want) {
	b.mu.Lock()
	defer b.mu.Unlock()
	keep := map[netip.AddrPort]bool{}
	for _, w := range wants {
		keep[w.addr] = true
		if f, ok := b.listeners[w.addr]; ok {
			if f.nodePort == w.nodePort && f.service == w.service {
				continue
			}
			f.ln.Close()
			delete(b.listeners, w.addr)
		}
		ln, err := net.Listen("tcp", w.addr.String())
		if err != nil {
			b.cfg.Log.Warn("host port not forwarded", "service", w.service, "address", w.addr.String(), "err", err)
			continue
		}
		f := &forward{ln: ln, nodePort: w.nodePort, service: w.service}
		b.listeners[w.addr] = f
		go b.serve(f)
		b.cfg.Log.Info("forwarding", "service", w.service, "address", w.addr.String(), "nodePort", w.nodePort)
	}
	for ap, f := range b.listeners {
		if !keep[ap] {
			f.ln.Close()
			delete(b.listeners, ap)
		}
	}
}

func (b *Balancer) closeAll() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for ap, f := range b.listeners {
		f.ln.Close()
		delete(b.listeners, ap)
	}
}

// Forwarded returns the host ports open now, for tests and logs.
func (b *Balancer) Forwarded() []netip.AddrPort {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []netip.AddrPort
	for ap := range b.listeners {
		out = append(out, ap)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// serve accepts on f until its listener closes.
func (b *Balancer) serve(f *forward) {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		go b.forward(c, f.nodePort)
	}
}

// dialTimeout bounds one attempt at one node.
const dialTimeout = time.Second

// forward connects c to nodePort on the first node that accepts, and copies both ways.
func (b *Balancer) forward(c net.Conn, nodePort int32) {
	defer c.Close()
	var upstream net.Conn
	for _, node := range b.cfg.Nodes() {
		ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
		conn, err := b.cfg.Dial(ctx, "tcp", netip.AddrPortFrom(node, uint16(nodePort)).String())
		cancel()
		if err == nil {
			upstream = conn
			break
		}
	}
	if upstream == nil {
		return
	}
	defer upstream.Close()
	netpipe.Join(c, upstream)
}

func key(svc *corev1.Service) string { return svc.Namespace + "/" + svc.Name }
