package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// The uplink's network (slirp4netns' defaults, docs/local-provider.md "Network"): the bridge
// namespace's tap0 has UplinkAddr, the host is reached through UplinkGateway, and with
// HostLoopback that address also reaches the host's 127.0.0.1.
var (
	UplinkPrefix  = netip.MustParsePrefix("10.0.2.0/24")
	UplinkAddr    = netip.MustParseAddr("10.0.2.100")
	UplinkGateway = netip.MustParseAddr("10.0.2.2")
)

// UplinkDevice is the uplink's interface in the bridge namespace: slirp4netns' tap device in the bridge namespace: nothing else there may
// take its name.
const UplinkDevice = "tap0"

// natTable masquerades what leaves through the uplink: nodes and pods reach the host's networks
// with the uplink's address. The rule lives in the bridge namespace, as does the forwarding
// switch: nothing of the host's network configuration changes.
const natTable = `table ip constellation-nat {
	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		oifname "` + UplinkDevice + `" masquerade
	}
}
`

// Uplink is the cluster's way out to the host's networks: slirp4netns, a user-mode network
// stack (the one rootless containers use), attached to the bridge namespace as tap0, whose
// connections to the outside are the slirp4netns process's own sockets on the host. The bridge
// namespace forwards and masquerades the nodes' traffic to it. The host's routing, forwarding
// and firewall are left alone, so the cluster needs no host-global change and removing it
// leaves nothing behind.
type Uplink struct {
	cmd   *exec.Cmd
	exitW *os.File // closing it makes slirp4netns exit (--exit-fd)
	done  chan struct{}
	err   error // set before done is closed
}

// StartUplink starts the uplink of the bridge namespace (CreateBridge first) and waits until it
// is configured, then turns on forwarding and masquerading there. Without hostLoopback the
// host's loopback is not reachable (--disable-host-loopback). slirp4netns also exits when the
// calling process dies (its exit pipe closes with it).
func (n Network) StartUplink(ctx context.Context, hostLoopback bool) (*Uplink, error) {
	exitR, exitW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	readyR, readyW, err := os.Pipe()
	if err != nil {
		exitR.Close()
		exitW.Close()
		return nil, err
	}
	defer readyR.Close()
	// fds 3 and 4 of the child: ExtraFiles in order.
	args := []string{"--configure", "--mtu=65520", "--exit-fd=3", "--ready-fd=4", "--netns-type=path"}
	if !hostLoopback {
		args = append(args, "--disable-host-loopback")
	}
	args = append(args, NSPath(n.BridgeNS()), UplinkDevice)
	cmd := exec.Command("slirp4netns", args...)
	// Only the end of what slirp4netns prints is kept for the error: it can print a line per
	// failed read in a loop.
	out := &tailWriter{max: 4 << 10}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.ExtraFiles = []*os.File{exitR, readyW}
	err = cmd.Start()
	exitR.Close()
	readyW.Close()
	if err != nil {
		exitW.Close()
		return nil, fmt.Errorf("starting the uplink (slirp4netns): %w", err)
	}
	u := &Uplink{cmd: cmd, exitW: exitW, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		if err == nil {
			err = errors.New("exited")
		}
		u.err = fmt.Errorf("slirp4netns: %w: %s", err, strings.TrimSpace(out.String()))
		close(u.done)
	}()
	ready := make(chan error, 1)
	go func() {
		b := make([]byte, 1)
		_, err := io.ReadFull(readyR, b)
		ready <- err
	}()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	select {
	case err = <-ready:
	case <-u.done:
		err = u.err
	case <-ctx.Done():
		err = fmt.Errorf("waiting for slirp4netns to configure %s: %w", UplinkDevice, ctx.Err())
	}
	if err == nil {
		err = n.natInBridge(ctx)
	}
	if err != nil {
		u.Stop()
		return nil, fmt.Errorf("starting the uplink: %w", err)
	}
	return u, nil
}

// natInBridge turns on forwarding and masquerading in the bridge namespace.
func (n Network) natInBridge(ctx context.Context) error {
	ns := NSPath(n.BridgeNS())
	if err := run(ctx, "nsenter", "--net="+ns, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "nsenter", "--net="+ns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(natTable)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("masquerading in %s: %w: %s", n.BridgeNS(), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Done is closed when slirp4netns has exited; Err then says why.
func (u *Uplink) Done() <-chan struct{} { return u.done }

// Err is why slirp4netns exited, once Done is closed.
func (u *Uplink) Err() error {
	select {
	case <-u.done:
		return u.err
	default:
		return nil
	}
}

// PID is slirp4netns' process ID.
func (u *Uplink) PID() int { return u.cmd.Process.Pid }

// Stop ends slirp4netns (closing its exit pipe, then killing it if it has not exited within
// 5 s) and waits for it. Stopping a stopped uplink does nothing.
func (u *Uplink) Stop() {
	u.exitW.Close()
	select {
	case <-u.done:
		return
	case <-time.After(5 * time.Second):
	}
	_ = u.cmd.Process.Kill()
	<-u.done
}

// tailWriter keeps the last max bytes written to it.
type tailWriter struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (w *tailWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	if over := len(w.buf) - w.max; over > 0 {
		w.buf = append(w.buf[:0], w.buf[over:]...)
	}
	return len(p), nil
}

func (w *tailWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.buf)
}
