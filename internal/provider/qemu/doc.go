// Package qemu is the QEMU provider: a cluster's nodes are QEMU virtual machines that boot the
// node OS image (make vm-image) with OVMF firmware measuring the boot into each machine's own
// swtpm, on the host's cluster network. The provider process around them (network bridge,
// metadata service, API load balancer, NAT, watchdog, volumes) is the local provider's
// (internal/provider/local/cluster); this package gives it its machines (Machines), and
// its subpackages run one machine (vm) and wire it to the network (vmnet). docs/qemu-provider.md
// describes the boot chain and what is measured where.
package qemu
