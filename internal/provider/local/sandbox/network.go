// Package sandbox holds the host side of the local provider's node sandboxes: the private
// network (a bridge in its own network namespace, one namespace and veth per node), entering
// those namespaces from Go, and the cgroup that holds every process of a cluster so that it
// can be removed without leftovers. Addresses and names are fixed in docs/local-provider.md.
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
)

// Fixed addressing of a local cluster (docs/local-provider.md). Every cluster has its own
// bridge namespace, so two clusters on one machine do not collide.
var (
	BridgeAddr = netip.MustParseAddr("10.42.0.1")
	// APIAddr is the cluster's stable API server address: the provider's load balancer
	// (internal/provider/local/apilb) listens there, in the bridge namespace, on port 6443.
	APIAddr     = netip.MustParseAddr("10.42.0.2")
	NodePrefix  = netip.MustParsePrefix("10.42.0.0/24")
	PodCIDR     = netip.MustParsePrefix("10.244.0.0/16")
	ServiceCIDR = netip.MustParsePrefix("10.96.0.0/12")
)

// MaxNodes bounds the node index so addresses stay inside NodePrefix and PodCIDR.
const MaxNodes = 200

// NodeAddr is the address of node i (0-based).
func NodeAddr(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 42, 0, byte(10 + i)})
}

// NodePodCIDR is the pod range of node i.
func NodePodCIDR(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), 0}), 24)
}

// Network is the private network of one cluster.
type Network struct {
	// ID makes namespace names unique per cluster (short: interface names are limited).
	ID string
}

// BridgeNS is the name of the namespace holding the bridge.
func (n Network) BridgeNS() string { return "cmini-" + n.ID + "-br" }

// NodeNS is the name of node's network namespace.
func (n Network) NodeNS(node string) string { return "cmini-" + n.ID + "-" + node }

// NSPath is where `ip netns` keeps a named namespace.
func NSPath(name string) string { return "/run/netns/" + name }

// CreateBridge creates the bridge namespace with br0 at BridgeAddr, and APIAddr on br0 too
// (a /32: the nodes reach it on their /24 through the bridge, which answers ARP for it).
//
// br0's hardware address is set (BridgeMAC), so that it does not change when a node's
// veth leaves the bridge: every node caches it for the gateway and the API load balancer.
func (n Network) CreateBridge(ctx context.Context) error {
	ns := n.BridgeNS()
	mac, err := BridgeMAC(BridgeAddr)
	if err != nil {
		return err
	}
	return runAll(ctx,
		[]string{"ip", "netns", "add", ns},
		[]string{"ip", "-n", ns, "link", "set", "lo", "up"},
		[]string{"ip", "-n", ns, "link", "add", "br0", "address", mac, "type", "bridge"},
		[]string{"ip", "-n", ns, "addr", "add", netip.PrefixFrom(BridgeAddr, NodePrefix.Bits()).String(), "dev", "br0"},
		[]string{"ip", "-n", ns, "addr", "add", netip.PrefixFrom(APIAddr, 32).String(), "dev", "br0"},
		[]string{"ip", "-n", ns, "link", "set", "br0", "up"},
	)
}

// AddNode creates node i's namespace, wires it to the bridge with a veth (eth0 inside), gives
// it its address, a default route to the bridge (and the bridge namespace a route to its pod
// range), routes to the pod ranges of the other nodes (peers: their indexes), and turns on
// forwarding so its pods are reachable.
func (n Network) AddNode(ctx context.Context, name string, i int, peers []int) error {
	if i < 0 || i >= MaxNodes {
		return fmt.Errorf("node index %d out of range 0..%d", i, MaxNodes-1)
	}
	ns, br := n.NodeNS(name), n.BridgeNS()
	host := fmt.Sprintf("v%d", i)
	cmds := [][]string{
		{"ip", "netns", "add", ns},
		{"ip", "-n", ns, "link", "set", "lo", "up"},
		{"ip", "-n", br, "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", ns},
		{"ip", "-n", br, "link", "set", host, "master", "br0"},
		{"ip", "-n", br, "link", "set", host, "up"},
		{"ip", "-n", ns, "addr", "add", netip.PrefixFrom(NodeAddr(i), NodePrefix.Bits()).String(), "dev", "eth0"},
		{"ip", "-n", ns, "link", "set", "eth0", "up"},
		{"ip", "-n", ns, "route", "add", "default", "via", BridgeAddr.String()},
		// The bridge namespace routes the node's pod range to it: the answers to what its pods
		// send out through the uplink (StartUplink) come back that way.
		{"ip", "-n", br, "route", "replace", NodePodCIDR(i).String(), "via", NodeAddr(i).String()},
	}
	for _, j := range peers {
		if j != i {
			cmds = append(cmds, []string{"ip", "-n", ns, "route", "add", NodePodCIDR(j).String(), "via", NodeAddr(j).String()})
		}
	}
	cmds = append(cmds, []string{"nsenter", "--net=" + NSPath(ns), "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"})
	return runAll(ctx, cmds...)
}

// Delete removes the namespaces of the bridge and of nodes (veths go with them). Missing
// namespaces are not an error, so Delete also cleans up after a half-done create.
func (n Network) Delete(ctx context.Context, nodes []string) error {
	var errs []error
	names := []string{n.BridgeNS()}
	for _, node := range nodes {
		names = append(names, n.NodeNS(node))
	}
	for _, name := range names {
		if _, err := os.Stat(NSPath(name)); errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err := run(ctx, "ip", "netns", "del", name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// DeleteNode removes the veth and namespace of node i; missing ones are not an error. The
// veth is deleted explicitly first: a deleted namespace's interfaces go away only when the
// kernel gets around to freeing the namespace, and a boot that follows at once would find
// the old veth's name taken.
func (n Network) DeleteNode(ctx context.Context, node string, i int) error {
	if out, err := exec.CommandContext(ctx, "ip", "-n", n.BridgeNS(), "link", "del", fmt.Sprintf("v%d", i)).CombinedOutput(); err != nil &&
		!strings.Contains(string(out), "Cannot find device") && !strings.Contains(string(out), "No such file") {
		return fmt.Errorf("deleting the veth of %s: %w: %s", node, err, strings.TrimSpace(string(out)))
	}
	if out, err := exec.CommandContext(ctx, "ip", "-n", n.BridgeNS(), "route", "del", NodePodCIDR(i).String()).CombinedOutput(); err != nil &&
		!strings.Contains(string(out), "No such process") && !strings.Contains(string(out), "No such file") {
		return fmt.Errorf("deleting the route to the pods of %s: %w: %s", node, err, strings.TrimSpace(string(out)))
	}
	name := n.NodeNS(node)
	if _, err := os.Stat(NSPath(name)); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return run(ctx, "ip", "netns", "del", name)
}

// Route adds (add) or removes the route on node to the pod range of node index peer. A node
// whose namespace does not exist (it is off) is skipped: it gets every route when it boots.
func (n Network) Route(ctx context.Context, node string, peer int, add bool) error {
	ns := n.NodeNS(node)
	if _, err := os.Stat(NSPath(ns)); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	verb := "replace"
	if !add {
		verb = "del"
	}
	err := run(ctx, "ip", "-n", ns, "route", verb, NodePodCIDR(peer).String(), "via", NodeAddr(peer).String())
	if err != nil && !add && strings.Contains(err.Error(), "No such process") {
		return nil
	}
	return err
}

// Leftovers lists the namespaces of this network that exist.
func (n Network) Leftovers() []string {
	entries, _ := os.ReadDir("/run/netns")
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "cmini-"+n.ID+"-") {
			out = append(out, e.Name())
		}
	}
	return out
}

func runAll(ctx context.Context, cmds ...[]string) error {
	for _, c := range cmds {
		if err := run(ctx, c[0], c[1:]...); err != nil {
			return err
		}
	}
	return nil
}

func run(ctx context.Context, name string, args ...string) error {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
