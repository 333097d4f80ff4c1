package boot

import (
	"testing"
	"time"
)

// SetStateDiskRecheck sets how often a refused state disk is looked at again, until t ends.
func SetStateDiskRecheck(t testing.TB, d time.Duration) {
	old := stateDiskRecheck
	stateDiskRecheck = d
	t.Cleanup(func() { stateDiskRecheck = old })
}
