package cluster

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
)

// A failure is handled once per boot: the bootstrapper's and the TPM's watchers of one boot
// may both see the node fail, and the node must be rebooted once, not twice (the second
// reboot would hit the boot the first one started). Failures of a boot the provider is ending
// itself (reboot, power cut, deletion, stop), of an earlier boot, or after the provider
// stopped are not failures.
func TestClaimFailure(t *testing.T) {
	for name, tc := range map[string]struct {
		ending  bool
		boots   int
		stopped bool
		want    bool
	}{
		"a running boot fails":               {boots: 3, want: true},
		"the provider is ending the boot":    {ending: true, boots: 3},
		"a watcher of an earlier boot":       {boots: 4},
		"the provider stopped":               {boots: 3, stopped: true},
		"the provider stopped while ending":  {ending: true, boots: 3, stopped: true},
		"an earlier boot that was ended too": {ending: true, boots: 4},
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.stopped {
				cancel()
			}
			p := &Provider{ctx: ctx}
			n := &node{ending: tc.ending, boots: tc.boots}
			assert.Equal(t, tc.want, p.claimFailureLocked(n, 3))
			assert.False(t, p.claimFailureLocked(n, 3), "a second failure of the same boot is not handled again")
		})
	}
}
