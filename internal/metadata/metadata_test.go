package metadata_test

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/openconstellation/constellation/internal/metadata"
)

func TestInstanceValidate(t *testing.T) {
	ip := netip.MustParseAddr("10.42.0.2")
	for name, tc := range map[string]struct {
		in   metadata.Instance
		want []string
	}{
		"worker":        {in: metadata.Instance{Name: "worker-0", Role: metadata.Worker, IPs: []netip.Addr{ip}}},
		"control plane": {in: metadata.Instance{Name: "cp-0", Role: metadata.ControlPlane, IPs: []netip.Addr{ip}}},
		"everything wrong": {
			in:   metadata.Instance{Role: "admin", IPs: []netip.Addr{{}, netip.IPv4Unspecified()}},
			want: []string{"no name", `role "admin"`, "unusable IP address invalid IP", "unusable IP address 0.0.0.0"},
		},
		"no IPs": {in: metadata.Instance{Name: "n", Role: metadata.Worker}, want: []string{"no IP address"}},
	} {
		t.Run(name, func(t *testing.T) {
			err := tc.in.Validate()
			if tc.want == nil {
				assert.NoError(t, err)
				return
			}
			for _, w := range tc.want {
				assert.ErrorContains(t, err, w)
			}
		})
	}
}
