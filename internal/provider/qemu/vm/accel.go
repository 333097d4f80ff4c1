package vm

import (
	"os"
	"regexp"
)

// hardwareVirt matches the CPU flags of Intel VT-x and AMD-V in /proc/cpuinfo.
var hardwareVirt = regexp.MustCompile(`(?m)^flags\s*:.*\b(vmx|svm)\b`)

// DetectAccel picks KVM when the host can run an OVMF guest under it, TCG otherwise, and says
// why. A /dev/kvm that opens is not enough: some hosts expose a KVM without hardware
// virtualization (paravirtualized KVM such as PVM, in nested cloud machines) on which QEMU
// starts but OVMF fails at its first instruction; those CPUs show neither vmx nor svm.
func DetectAccel() (Accel, string) {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return TCG, "no usable /dev/kvm (" + err.Error() + "): emulating the CPU with TCG, 3-15x slower than KVM"
	}
	f.Close()
	cpuinfo, err := os.ReadFile("/proc/cpuinfo")
	if err != nil || !hardwareVirt.Match(cpuinfo) {
		return TCG, "/dev/kvm exists but the CPU shows no hardware virtualization (vmx/svm): emulating the CPU with TCG, 3-15x slower than KVM"
	}
	return KVM, "hardware virtualization (KVM)"
}
