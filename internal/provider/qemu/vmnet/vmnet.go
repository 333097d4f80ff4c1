// Package vmnet wires the QEMU provider's machines into a cluster's private network: the
// local provider's bridge namespace (internal/provider/local/sandbox) with one tap device per
// machine on its bridge, and a DHCP server that gives each machine the address of its node
// index, by the MAC address the provider gave its network card.
//
// The addresses come from DHCP, not from the kernel command line: the command line is
// measured, so it must be the same for every node of an image. DHCP answers only the MAC
// addresses of the cluster's machines (static leases, no pool): an unknown card gets no
// address. Nothing on this network is trusted for more than availability: a node's identity
// is its attestation, not its address (docs/qemu-provider.md).
package vmnet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/openconstellation/constellation/internal/provider/local/sandbox"
)

// Tap is the tap device of node index i, in the bridge namespace. Not "tapN": the uplink's
// slirp4netns owns a tap device there too (sandbox.UplinkDevice, "tap0"); replacing it
// under slirp4netns made it print a read error in a busy loop, which filled the provider's
// memory within minutes.
func Tap(i int) string { return fmt.Sprintf("mtap%d", i) }

// MAC is the network card address of node index i: QEMU's locally administered prefix
// 52:54:00, then the node's IPv4 address's last three bytes.
func MAC(i int) string {
	a := sandbox.NodeAddr(i).As4()
	return fmt.Sprintf("52:54:00:%02x:%02x:%02x", a[1], a[2], a[3])
}

// AddTap creates node index i's tap device on the bridge of network n (replacing a stale one
// a killed provider left), and routes the node's pod range to it.
func AddTap(ctx context.Context, n sandbox.Network, i int) error {
	if i < 0 || i >= sandbox.MaxNodes {
		return fmt.Errorf("node index %d out of range 0..%d", i, sandbox.MaxNodes-1)
	}
	if err := DeleteTap(ctx, n, i); err != nil {
		return err
	}
	ns, tap := n.BridgeNS(), Tap(i)
	for _, c := range [][]string{
		{"ip", "-n", ns, "tuntap", "add", "dev", tap, "mode", "tap"},
		{"ip", "-n", ns, "link", "set", tap, "master", "br0"},
		{"ip", "-n", ns, "link", "set", tap, "up"},
		{"ip", "-n", ns, "route", "replace", sandbox.NodePodCIDR(i).String(), "via", sandbox.NodeAddr(i).String()},
	} {
		if out, err := exec.CommandContext(ctx, c[0], c[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %w: %s", strings.Join(c, " "), err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// DeleteTap removes node index i's tap device and pod route; missing ones are not an error.
func DeleteTap(ctx context.Context, n sandbox.Network, i int) error {
	ns := n.BridgeNS()
	for _, c := range [][]string{
		{"ip", "-n", ns, "link", "del", Tap(i)},
		{"ip", "-n", ns, "route", "del", sandbox.NodePodCIDR(i).String()},
	} {
		out, err := exec.CommandContext(ctx, c[0], c[1:]...).CombinedOutput()
		if err != nil && !strings.Contains(string(out), "Cannot find device") && !strings.Contains(string(out), "No such process") {
			return fmt.Errorf("%s: %w: %s", strings.Join(c, " "), err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// Lease is one machine's static DHCP lease.
type Lease struct {
	Index int
	Name  string
}

// DHCP is dnsmasq serving static leases on the bridge, in the bridge namespace, as a child of
// the provider. It serves DHCP only (no DNS: port 0).
type DHCP struct {
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
	err  error

	mu     sync.Mutex
	leases map[int]string
}

// hostsFile is dnsmasq's list of static leases (--dhcp-hostsfile), reread on SIGHUP.
const hostsFile = "dhcp-hosts"

// StartDHCP starts dnsmasq for network n, keeping its files in dir, with leases for the
// given machines.
func StartDHCP(ctx context.Context, n sandbox.Network, dir string, leases []Lease) (*DHCP, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	d := &DHCP{dir: dir, done: make(chan struct{}), leases: map[int]string{}}
	for _, l := range leases {
		d.leases[l.Index] = l.Name
	}
	if err := d.writeHosts(); err != nil {
		return nil, err
	}
	args := []string{"--net=" + sandbox.NSPath(n.BridgeNS()), "--",
		"dnsmasq", "--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv", "--no-hosts", "--port=0",
		"--interface=br0", "--bind-interfaces", "--dhcp-authoritative",
		"--dhcp-range=" + sandbox.NodePrefix.Addr().String() + ",static," + netmask() + ",infinite",
		"--dhcp-option=option:router," + sandbox.BridgeAddr.String(),
		"--dhcp-hostsfile=" + filepath.Join(dir, hostsFile),
		"--dhcp-leasefile=" + filepath.Join(dir, "dhcp-leases"),
		"--pid-file=", "--user=root", "--log-dhcp", "--log-facility=" + filepath.Join(dir, "dnsmasq.log"),
	}
	d.cmd = exec.Command("nsenter", args...)
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := os.OpenFile(filepath.Join(dir, "dnsmasq.out"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	defer out.Close()
	d.cmd.Stdout, d.cmd.Stderr = out, out
	if err := d.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting dnsmasq: %w", err)
	}
	go func() {
		d.err = d.cmd.Wait()
		close(d.done)
	}()
	// dnsmasq fails at start (bad option, address in use) within moments; a server that is
	// still up after a short while serves.
	select {
	case <-d.done:
		msg, _ := os.ReadFile(filepath.Join(dir, "dnsmasq.out"))
		return nil, fmt.Errorf("dnsmasq exited at start: %v: %s", d.err, strings.TrimSpace(string(msg)))
	case <-time.After(300 * time.Millisecond):
	case <-ctx.Done():
		d.Stop()
		return nil, ctx.Err()
	}
	return d, nil
}

func netmask() string {
	m := net.CIDRMask(sandbox.NodePrefix.Bits(), 32)
	return net.IP(m).String()
}

func (d *DHCP) writeHosts() error {
	idx := make([]int, 0, len(d.leases))
	for i := range d.leases {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	var b strings.Builder
	for _, i := range idx {
		fmt.Fprintf(&b, "%s,%s,%s\n", MAC(i), sandbox.NodeAddr(i), d.leases[i])
	}
	tmp := filepath.Join(d.dir, hostsFile+".tmp")
	if err := os.WriteFile(tmp, []byte(b.String()), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(d.dir, hostsFile))
}

// Set adds (or, with name "", removes) the lease of node index i and has dnsmasq reread its
// leases.
func (d *DHCP) Set(l Lease) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if l.Name == "" {
		delete(d.leases, l.Index)
	} else {
		d.leases[l.Index] = l.Name
	}
	if err := d.writeHosts(); err != nil {
		return err
	}
	select {
	case <-d.done:
		return errors.New("dnsmasq is not running")
	default:
	}
	return d.cmd.Process.Signal(syscall.SIGHUP)
}

// Done is closed once dnsmasq exited.
func (d *DHCP) Done() <-chan struct{} { return d.done }

// Stop ends dnsmasq and waits for it.
func (d *DHCP) Stop() {
	select {
	case <-d.done:
		return
	default:
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(5 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.done
	}
}
