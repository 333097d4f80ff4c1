package joinservice

import (
	"runtime/debug"
)

// The garbage collector's settings of a join service process (SetGCDefaults).
//
// A join allocates about 200 KiB, nearly all of it short-lived (handshake buffers, evidence,
// certificates), while the heap that survives between joins is a few MiB: with Go's default
// (GOGC=100) the collector runs every few joins and took about 9 % of the service's CPU at
// saturation. Four times the live heap between collections is tens of MiB on a control-plane
// node; the soft limit bounds the heap where the live heap itself is large (a burst of
// thousands of pending connections), where the collector then runs as often as it must.
const (
	GCPercent   = 400
	MemoryLimit = 512 << 20
)

// SetGCDefaults applies GCPercent and MemoryLimit to the process, each unless the environment
// sets it (GOGC, GOMEMLIMIT: an operator's choice wins). It returns a function that restores
// the settings before.
func SetGCDefaults(getenv func(string) string) (restore func()) {
	percent, limit := debug.SetGCPercent(-1), debug.SetMemoryLimit(-1)
	debug.SetGCPercent(percent)
	if getenv("GOGC") == "" {
		debug.SetGCPercent(GCPercent)
	}
	if getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(MemoryLimit)
	}
	return func() {
		debug.SetGCPercent(percent)
		debug.SetMemoryLimit(limit)
	}
}
