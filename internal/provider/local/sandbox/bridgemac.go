package sandbox

import (
	"fmt"
	"net/netip"
)

// BridgeMAC is the hardware address the local provider gives a Linux bridge whose address is
// a: locally administered (02:00) and the IPv4 address's four bytes, so it is stable.
//
// A bridge without an address set takes the lowest hardware address of its ports, so it changes
// whenever that port leaves: a deleted pod's veth changes a node's cni0, a deleted node's veth
// the sandbox's br0. Every neighbour that cached the old address (each pod's entry for its
// gateway, each node's for the API load balancer on br0) then sends to an address nobody has
// until its entry goes stale, seconds later: e2e TestUpgrade saw all pods of a node fail their
// readiness probes at once for 11 s when CoreDNS left the node. An address that is set stays.
func BridgeMAC(a netip.Addr) (string, error) {
	if !a.Is4() {
		return "", fmt.Errorf("bridge address %s: want IPv4", a)
	}
	b := a.As4()
	return fmt.Sprintf("02:00:%02x:%02x:%02x:%02x", b[0], b[1], b[2], b[3]), nil
}
