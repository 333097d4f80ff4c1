package conformance

import (
	"regexp"
	"strings"
)

// Smoke is the subset of the suite that CI runs on every change (test/e2e
// TestConformanceSmoke): networking between pods and nodes, DNS, Services, pods, ConfigMaps and
// Secrets, a few minutes on a 1 + 2 cluster. The names are the suite's, exactly: a name that
// matches no test makes the smoke run fail (it counts what ran).
var Smoke = []string{
	"[sig-network] DNS should provide /etc/hosts entries for the cluster [Conformance]",
	"[sig-network] DNS should provide DNS for ExternalName services [Conformance]",
	"[sig-network] DNS should provide DNS for services [Conformance]",
	"[sig-network] DNS should provide DNS for the cluster [Conformance]",
	"[sig-network] Networking Granular Checks: Pods should function for intra-pod communication: http [NodeConformance] [Conformance]",
	"[sig-network] Networking Granular Checks: Pods should function for intra-pod communication: udp [NodeConformance] [Conformance]",
	"[sig-network] Networking Granular Checks: Pods should function for node-pod communication: http [LinuxOnly] [NodeConformance] [Conformance]",
	"[sig-network] Networking Granular Checks: Pods should function for node-pod communication: udp [LinuxOnly] [NodeConformance] [Conformance]",
	"[sig-network] Services should serve a basic endpoint from pods [Conformance]",
	"[sig-network] Services should serve endpoints on same port and different protocols [Conformance]",
	"[sig-network] Services should serve multiport endpoints from pods [Conformance]",
	"[sig-node] ConfigMap should be consumable via environment variable [NodeConformance] [Conformance]",
	"[sig-node] Pods should be submitted and removed [NodeConformance] [Conformance]",
	"[sig-node] Pods should get a host IP [NodeConformance] [Conformance]",
	"[sig-node] Secrets should be consumable from pods in env vars [NodeConformance] [Conformance]",
	"[sig-storage] ConfigMap should be consumable from pods in volume [NodeConformance] [Conformance]",
	"[sig-storage] Secrets should be consumable from pods in volume [NodeConformance] [Conformance]",
}

// SmokeFocus is the suite's focus expression selecting exactly Smoke: each name literally.
// Ginkgo matches a focus against more than the name (measured: "^[sig-network] DNS" selects
// nothing), so the names are not anchored; each ends with its "[Conformance]" tag, and the
// smoke test counts what ran.
func SmokeFocus() string {
	parts := make([]string, len(Smoke))
	for i, n := range Smoke {
		parts[i] = regexp.QuoteMeta(n)
	}
	return strings.Join(parts, "|")
}
