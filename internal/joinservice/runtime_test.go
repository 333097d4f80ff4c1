package joinservice_test

import (
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/openconstellation/constellation/internal/joinservice"
)

func TestSetGCDefaults(t *testing.T) {
	// What the process runs with (the test binary's environment may set either).
	percent, limit := debug.SetGCPercent(-1), debug.SetMemoryLimit(-1)
	debug.SetGCPercent(percent)
	for _, tc := range []struct {
		name        string
		env         map[string]string
		wantPercent int
		wantLimit   int64
	}{
		{"defaults", nil, joinservice.GCPercent, joinservice.MemoryLimit},
		{"GOGC set by the operator", map[string]string{"GOGC": "50"}, percent, joinservice.MemoryLimit},
		{"GOMEMLIMIT set by the operator", map[string]string{"GOMEMLIMIT": "1GiB"}, joinservice.GCPercent, limit},
	} {
		t.Run(tc.name, func(t *testing.T) {
			restore := joinservice.SetGCDefaults(func(k string) string { return tc.env[k] })
			gotPercent, gotLimit := debug.SetGCPercent(-1), debug.SetMemoryLimit(-1)
			debug.SetGCPercent(gotPercent)
			restore()
			assert.Equal(t, tc.wantPercent, gotPercent)
			assert.Equal(t, tc.wantLimit, gotLimit)
			assert.Equal(t, percent, debug.SetGCPercent(percent), "restored")
		})
	}
}
