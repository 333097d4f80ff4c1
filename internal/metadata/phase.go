package metadata

import (
	"context"
	"regexp"
	"time"
)

// Phases a node's bootstrapper reports to its platform as it goes (the local provider's
// PUT /v1/self/report, a cloud's guest attributes), shown to the operator by `constellation
// status` and waited on by `reboot` and `recover`. They are diagnosis: nothing trusts them
// for security.
const (
	// PhaseBooting: the node's OS is booting; its bootstrapper has not decided yet.
	PhaseBooting = "booting"
	// PhaseWaitingForJoinService: a rebooted worker found no join service answering; its
	// rejoin keeps retrying until the control planes are back.
	PhaseWaitingForJoinService = "waiting-for-join-service"
	// PhaseWaitingForRecovery: a rebooted control plane found no join service answering; it
	// waits for a rejoin ticket or for `constellation recover`.
	PhaseWaitingForRecovery = "waiting-for-recovery"
	// The node is in its cluster, by init, join, rejoin or recovery.
	PhaseInitialized = "initialized"
	PhaseJoined      = "joined"
	PhaseRejoined    = "rejoined"
	PhaseRecovered   = "recovered"
	// PhaseKubeletFailed: the node's kubelet died after the node was in its cluster; the
	// bootstrapper exits and the platform's watchdog reboots the node.
	PhaseKubeletFailed = "kubelet-failed"
	// PhaseTPMCannotQuote: the node's TPM does not quote with its attestation key, so the
	// node can prove nothing and offers nothing; the report's detail says why (for a
	// dictionary-attack lockout, when it clears). The bootstrapper checks again until it
	// quotes, then goes on.
	PhaseTPMCannotQuote = "tpm-cannot-quote"
	// PhaseStateDiskRefused: the node's state disk is not one it will use (its header is not
	// the one the node makes: replaced, forged or damaged); the report's detail names what
	// differs. The node uses nothing of the disk and writes nothing to it; it looks again
	// until the disk is one it will use, then goes on.
	PhaseStateDiskRefused = "state-disk-refused"
)

// StateDiskRecheck is how often a node that reports PhaseStateDiskRefused looks at its disk
// again (and reports again).
const StateDiskRecheck = 30 * time.Second

// ValidPhase reports whether a node's report names a phase a platform passes on: a short
// lower-case word list. What a node reports is its own text: platforms refuse anything else.
func ValidPhase(phase string) bool { return phasePattern.MatchString(phase) }

// PhasePattern is what ValidPhase accepts, for messages.
const PhasePattern = `\A[a-z][a-z-]{0,63}\z`

var phasePattern = regexp.MustCompile(PhasePattern)

// InCluster reports whether phase says the node's bootstrapper brought it into its cluster.
func InCluster(phase string) bool {
	switch phase {
	case PhaseInitialized, PhaseJoined, PhaseRejoined, PhaseRecovered:
		return true
	}
	return false
}

// Reporter tells the platform a node's phase (one of the Phase constants) and, for some, why
// (detail; "" for none). Beside Provider: what the node says about itself, where Provider is
// what the platform says about the node.
type Reporter interface {
	ReportDetail(ctx context.Context, phase, detail string) error
}
