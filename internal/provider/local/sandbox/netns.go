package sandbox

import (
	"context"
	"fmt"
	"net"
	"runtime"

	"github.com/vishvananda/netns"
)

// Do runs fn on an OS thread that has entered the network namespace at nsPath. Sockets
// created by fn stay in that namespace after Do returns, which is how the provider serves
// and dials inside the private network from the host's namespace.
func Do(nsPath string, fn func() error) error {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("reading current network namespace: %w", err)
	}
	defer orig.Close()
	target, err := netns.GetFromPath(nsPath)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("opening network namespace %s: %w", nsPath, err)
	}
	defer target.Close()
	if err := netns.Set(target); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("entering network namespace %s: %w", nsPath, err)
	}
	fnErr := fn()
	if err := netns.Set(orig); err != nil {
		// The thread stays locked, so the runtime discards it with this goroutine instead of
		// reusing a thread in the wrong namespace.
		return fmt.Errorf("leaving network namespace %s: %w", nsPath, err)
	}
	runtime.UnlockOSThread()
	return fnErr
}

// DialContext connects to addr from inside the namespace at nsPath.
func DialContext(ctx context.Context, nsPath, network, addr string) (net.Conn, error) {
	var conn net.Conn
	err := Do(nsPath, func() error {
		var err error
		conn, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	})
	return conn, err
}

// Listen listens on addr inside the namespace at nsPath.
func Listen(nsPath, network, addr string) (net.Listener, error) {
	var l net.Listener
	err := Do(nsPath, func() error {
		var err error
		l, err = net.Listen(network, addr)
		return err
	})
	return l, err
}
