package azuresim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v8"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v7"

	"github.com/openconstellation/constellation/internal/netpipe"
)

// Reach connects to a port of the machine behind a VM of the simulated cloud: the test's
// stand-in for the VM's network interface (tests run a sandbox node per VM).
type Reach func(ctx context.Context, group, vm string, port int) (net.Conn, error)

// reachTimeout bounds one connection attempt to a backend.
const reachTimeout = 10 * time.Second

// internet makes the subscription's public addresses reachable from this host: each public
// address is a loopback address (127.77.X.N, X chosen at random per cloud so that two clouds
// on one host do not collide), and every frontend port of a load balancer's rules is a real
// listener on it. A connection is routed as the load balancer routes it: a load-balancing
// rule to one of its backend pool's running VMs (the next that answers: the stand-in for
// the health probe), an inbound NAT rule to its VM's backend port.
type internet struct {
	reach  Reach
	prefix string
	// listeners by frontend address and port; next rotates the backends a rule picks.
	listeners map[netip.AddrPort]net.Listener
	next      int
	wg        sync.WaitGroup
	closed    bool
	// conns are the connections routed now, both sides, closed by stop.
	conns map[net.Conn]bool
}

// ServeInternet makes the cloud's public addresses real on this host, reaching VMs through
// reach; call it before the first public address is created. The returned stop closes every
// listener and waits for their connections' routing to end.
func (c *Cloud) ServeInternet(reach Reach) (stop func()) {
	c.mu.Lock()
	c.internet = &internet{reach: reach, prefix: fmt.Sprintf("127.77.%d.", 1+rand.IntN(254)), listeners: map[netip.AddrPort]net.Listener{}, conns: map[net.Conn]bool{}}
	in := c.internet
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		in.closed = true
		for a, l := range in.listeners {
			l.Close()
			delete(in.listeners, a)
		}
		for conn := range in.conns {
			conn.Close()
		}
		c.mu.Unlock()
		in.wg.Wait()
	}
}

// publicAddress is the next public address: on this host's loopback when the Internet is
// served, else in TEST-NET-3. Called with c.mu held.
func (c *Cloud) publicAddress() string {
	c.nextPublic++
	if c.internet != nil {
		return c.internet.prefix + strconv.Itoa(c.nextPublic)
	}
	return fmt.Sprintf("203.0.113.%d", c.nextPublic)
}

// frontend is a rule's frontend port on a public address: a load-balancing rule's, which
// balances over the interfaces in its backend pool, or an inbound NAT rule's, which leads to
// the interface that names it.
type frontend struct {
	rg string
	// ref is the backend pool's ID (balanced) or the NAT rule's, as interfaces name them.
	ref         string
	balanced    bool
	backendPort int32
}

// frontends lists every frontend port of the cloud's load balancers by address. Called with
// c.mu held.
func (c *Cloud) frontends() map[netip.AddrPort]frontend {
	out := map[netip.AddrPort]frontend{}
	for rg, g := range c.groups {
		for _, lb := range g.lbs {
			if lb.Properties == nil {
				continue
			}
			addrs := map[string]netip.Addr{} // frontend configuration ID -> address
			for _, f := range lb.Properties.FrontendIPConfigurations {
				if f.ID == nil || f.Properties == nil || f.Properties.PublicIPAddress == nil || f.Properties.PublicIPAddress.ID == nil {
					continue
				}
				v, err := c.lookup(*f.Properties.PublicIPAddress.ID)
				if err != nil {
					continue
				}
				ip := v.(*armnetwork.PublicIPAddress)
				if ip.Properties == nil || ip.Properties.IPAddress == nil {
					continue
				}
				if a, err := netip.ParseAddr(*ip.Properties.IPAddress); err == nil {
					addrs[strings.ToLower(*f.ID)] = a
				}
			}
			add := func(front *armnetwork.SubResource, port, backendPort *int32, f frontend) {
				if front == nil || front.ID == nil || port == nil || backendPort == nil {
					return // a rule of a port range or all ports: not simulated
				}
				if a, ok := addrs[strings.ToLower(*front.ID)]; ok {
					f.rg, f.backendPort = rg, *backendPort
					out[netip.AddrPortFrom(a, uint16(*port))] = f
				}
			}
			for _, r := range lb.Properties.LoadBalancingRules {
				if p := r.Properties; p != nil && p.BackendAddressPool != nil && p.BackendAddressPool.ID != nil {
					add(p.FrontendIPConfiguration, p.FrontendPort, p.BackendPort, frontend{ref: *p.BackendAddressPool.ID, balanced: true})
				}
			}
			for _, r := range lb.Properties.InboundNatRules {
				if p := r.Properties; p != nil && r.ID != nil {
					add(p.FrontendIPConfiguration, p.FrontendPort, p.BackendPort, frontend{ref: *r.ID})
				}
			}
		}
	}
	return out
}

// syncInternet opens a listener for every frontend port that has none and closes those of
// frontends that are gone. Called after every request, with c.mu not held.
func (c *Cloud) syncInternet() {
	c.mu.Lock()
	defer c.mu.Unlock()
	in := c.internet
	if in == nil || in.closed {
		return
	}
	want := c.frontends()
	for a, l := range in.listeners {
		if _, ok := want[a]; !ok {
			l.Close()
			delete(in.listeners, a)
		}
	}
	for a := range want {
		if _, ok := in.listeners[a]; ok || !a.Addr().IsLoopback() {
			continue
		}
		l, err := net.Listen("tcp", a.String())
		if err != nil {
			slog.Error("azuresim: cannot serve a load balancer's frontend", "address", a, "err", err)
			continue
		}
		in.listeners[a] = l
		in.wg.Add(1)
		go func() {
			defer in.wg.Done()
			for {
				conn, err := l.Accept()
				if err != nil {
					return
				}
				in.wg.Add(1)
				go func() {
					defer in.wg.Done()
					c.route(conn, a)
				}()
			}
		}()
	}
}

// backend is a VM's port a frontend leads to.
type backend struct {
	rg, vm string
	port   int
}

// backends are the backends of the frontend at a, in the order to try them. Called with c.mu
// held.
func (c *Cloud) backends(a netip.AddrPort) ([]backend, error) {
	f, ok := c.frontends()[a]
	if !ok {
		return nil, fmt.Errorf("no load balancer rule has frontend %s", a)
	}
	var out []backend
	for _, v := range c.runningVMs(c.groups[f.rg], f.ref) {
		out = append(out, backend{rg: f.rg, vm: v, port: int(f.backendPort)})
	}
	if f.balanced && len(out) > 0 {
		c.internet.next++
		k := c.internet.next % len(out)
		out = append(out[k:], out[:k]...)
	}
	return out, nil
}

// runningVMs are the names of the group's running VMs with an interface that names ref (a
// backend pool or a NAT rule), sorted. Called with c.mu held.
func (c *Cloud) runningVMs(g *group, ref string) []string {
	var out []string
	names := keys(g.vms)
	slices.Sort(names)
	for _, name := range names {
		v := g.vms[name]
		if v.power != "running" || v.Properties == nil || v.Properties.NetworkProfile == nil {
			continue
		}
		if slices.ContainsFunc(v.Properties.NetworkProfile.NetworkInterfaces, func(nic *armcompute.NetworkInterfaceReference) bool {
			return nic.ID != nil && c.interfaceNames(*nic.ID, ref)
		}) {
			out = append(out, *v.Name)
		}
	}
	return out
}

// interfaceNames says whether the interface nicID names ref among its backend pools or NAT
// rules. Called with c.mu held.
func (c *Cloud) interfaceNames(nicID, ref string) bool {
	n, err := c.lookup(nicID)
	if err != nil || n.(*armnetwork.Interface).Properties == nil {
		return false
	}
	for _, ipc := range n.(*armnetwork.Interface).Properties.IPConfigurations {
		if ipc.Properties == nil {
			continue
		}
		for _, p := range ipc.Properties.LoadBalancerBackendAddressPools {
			if p.ID != nil && strings.EqualFold(*p.ID, ref) {
				return true
			}
		}
		for _, r := range ipc.Properties.LoadBalancerInboundNatRules {
			if r.ID != nil && strings.EqualFold(*r.ID, ref) {
				return true
			}
		}
	}
	return false
}

// route forwards conn, accepted on frontend a, to the first of the frontend's backends that
// answers; conn is closed if none does (as Azure drops a flow without a healthy backend).
func (c *Cloud) route(conn net.Conn, a netip.AddrPort) {
	c.mu.Lock()
	in := c.internet
	if !c.track(conn) {
		c.mu.Unlock()
		conn.Close()
		return
	}
	defer c.untrack(conn)
	bs, err := c.backends(a)
	c.mu.Unlock()
	if err != nil {
		slog.Warn("azuresim: dropped a connection", "frontend", a, "err", err)
		return
	}
	var errs []error
	for _, b := range bs {
		ctx, cancel := context.WithTimeout(context.Background(), reachTimeout)
		up, err := in.reach(ctx, b.rg, b.vm, b.port)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s port %d: %w", b.vm, b.port, err))
			continue
		}
		c.mu.Lock()
		tracked := c.track(up)
		c.mu.Unlock()
		if !tracked {
			up.Close()
			return
		}
		defer c.untrack(up)
		netpipe.Join(conn, up)
		return
	}
	if len(bs) == 0 {
		slog.Warn("azuresim: dropped a connection: no backend VM runs", "frontend", a)
		return
	}
	slog.Warn("azuresim: no backend answered", "frontend", a, "err", errors.Join(errs...))
}

// track records a routed connection for stop to close; false if stop ran already. Called with
// c.mu held.
func (c *Cloud) track(conn net.Conn) bool {
	if c.internet.closed {
		return false
	}
	c.internet.conns[conn] = true
	return true
}

// untrack closes conn and forgets it.
func (c *Cloud) untrack(conn net.Conn) {
	conn.Close()
	c.mu.Lock()
	delete(c.internet.conns, conn)
	c.mu.Unlock()
}
