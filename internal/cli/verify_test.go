package cli

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/state"
	"github.com/openconstellation/constellation/pkg/verify"
)

// Every target names the node whose evidence it must return, so verify can refuse another
// node's evidence at that address.
func TestVerifyTargets(t *testing.T) {
	st := &state.State{Nodes: []state.Node{
		{Name: "control-plane-0", IPs: []netip.Addr{netip.MustParseAddr("10.42.0.10")}},
		{Name: "worker-0", IPs: []netip.Addr{netip.MustParseAddr("10.42.0.11")}},
	}}
	for name, tc := range map[string]struct {
		opts    verifyOptions
		want    []verifyTarget
		wantErr string
	}{
		"every node": {want: []verifyTarget{
			{Node: "control-plane-0", Endpoint: "10.42.0.10:30081"}, {Node: "worker-0", Endpoint: "10.42.0.11:30081"},
		}},
		"one node":                     {opts: verifyOptions{nodes: []string{"worker-0"}}, want: []verifyTarget{{Node: "worker-0", Endpoint: "10.42.0.11:30081"}}},
		"unknown node":                 {opts: verifyOptions{nodes: []string{"worker-9"}}, wantErr: "--node worker-9: no such node"},
		"endpoint of a node":           {opts: verifyOptions{endpoint: "10.42.0.11:30081"}, want: []verifyTarget{{Node: "worker-0", Endpoint: "10.42.0.11:30081"}}},
		"endpoint named by --node":     {opts: verifyOptions{endpoint: "127.0.0.1:30090", nodes: []string{"worker-0"}}, want: []verifyTarget{{Node: "worker-0", Endpoint: "127.0.0.1:30090"}}},
		"endpoint of no node":          {opts: verifyOptions{endpoint: "127.0.0.1:30090"}, wantErr: "name the node the endpoint must answer for with --node"},
		"endpoint with two nodes":      {opts: verifyOptions{endpoint: "127.0.0.1:30090", nodes: []string{"worker-0", "control-plane-0"}}, wantErr: "at most one --node"},
		"endpoint with unknown --node": {opts: verifyOptions{endpoint: "127.0.0.1:30090", nodes: []string{"worker-9"}}, wantErr: "no such node"},
		"endpoint without port":        {opts: verifyOptions{endpoint: "10.42.0.11"}, wantErr: "missing port"},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := verifyTargets(st, tc.opts)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

// verify's output names the hardware the report was checked on, the reference it matched,
// and every warning (an unauthenticated AK among them).
func TestPrintVerifyReport(t *testing.T) {
	var out strings.Builder
	printVerifyReport(&out, verifyReport{
		verifyTarget: verifyTarget{Node: "worker-0", Endpoint: "10.0.0.5:30081"},
		Verified:     true,
		Result: &verify.Result{
			Variant: "aws-sev-snp", ReferenceSet: "image-v2",
			Signer:    verify.Signer{Certified: false},
			ClusterID: verify.ClusterIDCheck{Register: "PCR 15", ClusterID: "c1"},
			Warnings:  []string{"AK not authenticated: anyone who can run a TPM can produce this evidence"},
			Hardware: &verify.Hardware{Technology: "SEV-SNP", Product: "Genoa", Signer: "VLEK", TCB: "committed 3/0/8/115", Reference: "genoa-2025",
				Warnings: []string{"ID key digest not accepted (warn-only)"}},
		},
	})
	for _, want := range []string{
		`OK    worker-0 (10.0.0.5:30081): aws-sev-snp evidence, reference set "image-v2", AK not certified`,
		`hardware: SEV-SNP on Genoa, signed by VLEK, TCB committed 3/0/8/115, matched "genoa-2025"`,
		"warning: ID key digest not accepted (warn-only)",
		"warning: AK not authenticated",
	} {
		assert.Contains(t, out.String(), want)
	}
}
