package joinservice_test

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/joinservice"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/pkg/attestation"
)

type lister struct {
	instances []metadata.Instance
	err       error
}

func (l lister) Instances(context.Context) ([]metadata.Instance, error) { return l.instances, l.err }

func TestListerDirectory(t *testing.T) {
	ip := netip.MustParseAddr("10.42.0.11")
	platform := lister{instances: []metadata.Instance{
		{Name: "control-plane-0", Role: metadata.ControlPlane, IPs: []netip.Addr{netip.MustParseAddr("10.42.0.10")}},
		{Name: "worker-0", Role: metadata.Worker, IPs: []netip.Addr{ip}},
		{Name: "broken", Role: "admin", IPs: []netip.Addr{ip}},
	}}
	for name, tc := range map[string]struct {
		lister  lister
		lookup  string
		want    joinservice.Node
		wantErr string
	}{
		"worker":        {lister: platform, lookup: "worker-0", want: joinservice.Node{Name: "worker-0", Addresses: []netip.Addr{ip}}},
		"control plane": {lister: platform, lookup: "control-plane-0", want: joinservice.Node{Name: "control-plane-0", Addresses: []netip.Addr{netip.MustParseAddr("10.42.0.10")}, ControlPlane: true}},
		"unknown":       {lister: platform, lookup: "worker-9", wantErr: "unknown to the platform"},
		"invalid entry": {lister: platform, lookup: "broken", wantErr: `role "admin"`},
		"platform down": {lister: lister{err: errors.New("connection refused")}, lookup: "worker-0", wantErr: "listing the platform's instances: connection refused"},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := joinservice.ListerDirectory{Lister: tc.lister}.Lookup(context.Background(), tc.lookup)
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

// TestCertifiedNamesRole: a peer gets the role both its AK certificate and the platform's
// directory give it; a certificate without role, or one that disagrees with the directory,
// admits nothing.
func TestCertifiedNamesRole(t *testing.T) {
	dir := joinservice.StaticDirectory{
		"control-plane-0": {Name: "control-plane-0", ControlPlane: true},
		"worker-0":        {Name: "worker-0"},
	}
	for name, tc := range map[string]struct {
		peer    attestation.Verified
		wantErr string
	}{
		"control plane":          {peer: attestation.Verified{SignerCertified: true, SignerName: "control-plane-0", SignerRole: metadata.ControlPlane}},
		"worker":                 {peer: attestation.Verified{SignerCertified: true, SignerName: "worker-0", SignerRole: metadata.Worker}},
		"certificate names none": {peer: attestation.Verified{SignerCertified: true, SignerName: "worker-0"}, wantErr: "names no role"},
		"worker certified as control plane": {
			peer:    attestation.Verified{SignerCertified: true, SignerName: "worker-0", SignerRole: metadata.ControlPlane},
			wantErr: "its AK certificate says control-plane, the platform lists it as control plane: false",
		},
		"control plane certified as worker": {
			peer:    attestation.Verified{SignerCertified: true, SignerName: "control-plane-0", SignerRole: metadata.Worker},
			wantErr: "its AK certificate says worker",
		},
		"uncertified": {peer: attestation.Verified{SignerName: "worker-0", SignerRole: metadata.Worker}, wantErr: "no platform certificate"},
	} {
		t.Run(name, func(t *testing.T) {
			n, err := joinservice.CertifiedNames{Directory: dir}.Node(context.Background(), &tc.peer, netip.Addr{})
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.peer.SignerName, n.Name)
		})
	}
}
