package cluster

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/provider/local/apilb"
)

// The load balancer's backends are the provider's control planes whose boot runs: draining
// from the moment the provider begins to end a boot, gone once the node is off; workers and
// nodes not booted are none.
func TestLBBackendsFollowTheNodeList(t *testing.T) {
	running := make(chan struct{})
	testCases := map[string]struct {
		role         metadata.Role
		exited       chan struct{}
		ending, off  bool
		wantBackend  bool
		wantDraining bool
	}{
		"a running control plane":            {role: metadata.ControlPlane, exited: running, wantBackend: true},
		"a control plane being taken down":   {role: metadata.ControlPlane, exited: running, ending: true, wantBackend: true, wantDraining: true},
		"a control plane that is off":        {role: metadata.ControlPlane, exited: running, ending: true, off: true},
		"a control plane never booted (yet)": {role: metadata.ControlPlane},
		"a worker":                           {role: metadata.Worker, exited: running},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			lb := apilb.New(apilb.Config{
				HealthInterval: time.Hour,
				Dial: func(context.Context, string, string) (net.Conn, error) {
					return nil, errors.New("no network in a unit test")
				},
			})
			t.Cleanup(lb.Close)
			p := &Provider{lb: lb, nodes: map[string]*node{
				"n": {spec: NodeSpec{NodeSpec: provider.NodeSpec{Name: "n", Role: tc.role}, Index: 3}, exited: tc.exited, ending: tc.ending, off: tc.off},
			}}
			p.updateLBLocked()
			st := lb.Status()
			if !tc.wantBackend {
				assert.Empty(t, st)
				return
			}
			if assert.Len(t, st, 1) {
				assert.Equal(t, "10.42.0.13:6443", st[0].Addr)
				assert.Equal(t, tc.wantDraining, st[0].Draining)
			}
		})
	}
}
