// Package testnet picks ports for the processes tests start and must tell where to listen
// (etcd, kube-apiserver, CoreDNS, our services' main functions).
//
// The usual trick, listening on port 0 and closing the listener, hands out a port of the
// kernel's ephemeral range, from which every outgoing connection on the machine also takes its
// local port: between the close and the process's bind, a client connection (another test's
// API server dialling its etcd, say) can take the port, and the process fails with "address
// already in use". CI saw exactly that. Ports here come from below the ephemeral range
// (net.ipv4.ip_local_port_range), which only explicit binds use, chosen at random so that test
// binaries running in parallel rarely pick the same one, and checked free for TCP and UDP on
// every address when picked.
package testnet

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
)

// lowest is the first port handed out: above the registered ports services commonly use.
const lowest = 20000

// Ports returns n distinct free ports below the ephemeral range.
func Ports(n int) ([]int, error) {
	highest := ephemeralStart() - 1
	if highest <= lowest {
		return nil, fmt.Errorf("no ports below the ephemeral range (starts at %d)", highest+1)
	}
	seen := map[int]bool{}
	var ports []int
	for attempts := 0; len(ports) < n; attempts++ {
		if attempts > 1000 {
			return nil, fmt.Errorf("found only %d of %d free ports in [%d, %d]", len(ports), n, lowest, highest)
		}
		p := lowest + rand.IntN(highest-lowest+1)
		if seen[p] || !free(p) {
			continue
		}
		seen[p] = true
		ports = append(ports, p)
	}
	return ports, nil
}

// Port returns one free port below the ephemeral range, failing t if there is none.
func Port(t testing.TB) int {
	t.Helper()
	ports, err := Ports(1)
	if err != nil {
		t.Fatalf("testnet: %v", err)
	}
	return ports[0]
}

// Addr returns a free loopback address, "127.0.0.1:<port>", failing t if there is none.
func Addr(t testing.TB) string {
	t.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(Port(t)))
}

// free reports whether p can be bound for TCP and UDP on every address.
func free(p int) bool {
	addr := ":" + strconv.Itoa(p)
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	defer l.Close()
	c, err := net.ListenPacket("udp", addr)
	if err != nil {
		return false
	}
	return c.Close() == nil
}

// ephemeralStart is the first port of the kernel's ephemeral range (Linux's default when it
// cannot be read).
func ephemeralStart() int {
	data, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(data)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				return v
			}
		}
	}
	return 32768
}
