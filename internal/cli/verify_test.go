package cli

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/openconstellation/constellation/internal/retry"
	"github.com/openconstellation/constellation/internal/state"
	"github.com/openconstellation/constellation/pkg/attestation"
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
			Claims: verify.Claims{
				Variant: "aws-sev-snp", ReferenceSet: "image-v2",
				Signer:   verify.Signer{Certified: false},
				Warnings: []string{"AK not authenticated: anyone who can run a TPM can produce this evidence"},
				Hardware: &verify.Hardware{Technology: "SEV-SNP", Product: "Genoa", Signer: "VLEK", TCB: "committed 3/0/8/115", Reference: "genoa-2025",
					Warnings: []string{"ID key digest not accepted (warn-only)"}},
			},
			ClusterID: verify.ClusterIDCheck{Register: "PCR 15", ClusterID: "c1"},
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

// A node whose verification service does not answer is asked again for up to --wait; an
// answer that failed its checks is final; a node that never answers fails naming the first
// and the last error and what to do.
func TestVerifyWaiting(t *testing.T) {
	verifyRetry = retry.Policy{Initial: time.Millisecond, Max: 5 * time.Millisecond, Factor: 2}
	t.Cleanup(func() { verifyRetry = retry.Default })
	refused := fmt.Errorf("verify 10.42.0.11:30081: asking for evidence: %w", status.Error(codes.Unavailable, "connection error: dial tcp 10.42.0.11:30081: connect: connection refused"))
	noTPM := fmt.Errorf("verify 10.42.0.11:30081: asking for evidence: %w", status.Error(codes.Unavailable, "issuing evidence failed: opening the TPM: connection refused"))
	evidenceRefused := fmt.Errorf("verify 10.42.0.11:30081: evidence refused: %w", attestation.ErrMeasurementPolicy)
	ok := &verify.Result{Claims: verify.Claims{Variant: "qemu-vtpm"}}
	wrongNode := &verify.Result{Claims: verify.Claims{Variant: "qemu-vtpm"}}
	type answer struct {
		res *verify.Result
		err error
	}
	for name, tc := range map[string]struct {
		answers  []answer // then the last one forever
		wait     time.Duration
		wantErr  []string
		attempts int // at least
	}{
		"answers at once":              {answers: []answer{{res: ok}}, wait: time.Minute, attempts: 1},
		"restarting service":           {answers: []answer{{err: refused}, {err: refused}, {err: noTPM}, {res: ok}}, wait: time.Minute, attempts: 4},
		"evidence refused is final":    {answers: []answer{{err: evidenceRefused}, {res: ok}}, wait: time.Minute, attempts: 1, wantErr: []string{"evidence refused"}},
		"another node's evidence":      {answers: []answer{{res: wrongNode, err: verify.ErrWrongNode}, {res: ok}}, wait: time.Minute, attempts: 1, wantErr: []string{"not signed by the node asked about"}},
		"refused first, then evidence": {answers: []answer{{err: refused}, {err: evidenceRefused}}, wait: time.Minute, attempts: 2, wantErr: []string{"evidence refused", "first error: verify 10.42.0.11:30081: asking for evidence: rpc error: code = Unavailable desc = connection error"}},
		"never answers": {answers: []answer{{err: refused}, {err: noTPM}}, wait: 50 * time.Millisecond, attempts: 3, wantErr: []string{
			"issuing evidence failed", "(first error: ", "connect: connection refused", "gave up after",
			"the verification service of worker-0 did not answer within 50ms: check the node with 'constellation status'", "run 'constellation verify' again",
		}},
		"no waiting": {answers: []answer{{err: refused}, {res: ok}}, wait: 0, attempts: 1, wantErr: []string{"connection refused", "did not answer: check the node"}},
	} {
		t.Run(name, func(t *testing.T) {
			attempts := 0
			fn := func(ctx context.Context, node, endpoint string) (*verify.Result, error) {
				assert.Equal(t, "worker-0", node)
				assert.Equal(t, "10.42.0.11:30081", endpoint)
				a := tc.answers[min(attempts, len(tc.answers)-1)]
				attempts++
				return a.res, a.err
			}
			var out strings.Builder
			prog := newProgress(newPhaseTimer(&out))
			res, err := verifyWaiting(context.Background(), prog, verifyTarget{Node: "worker-0", Endpoint: "10.42.0.11:30081"}, tc.wait, fn)
			if tc.wantErr == nil {
				require.NoError(t, err)
				assert.Same(t, ok, res)
				assert.Equal(t, tc.attempts, attempts)
			} else {
				require.Error(t, err)
				for _, want := range tc.wantErr {
					assert.Contains(t, err.Error(), want)
				}
				if tc.wait > 0 && tc.attempts == 1 {
					assert.Equal(t, 1, attempts, "a checked answer is final")
				}
			}
			assert.GreaterOrEqual(t, attempts, tc.attempts)
			assert.Empty(t, prog.pending(), "nothing is waited for after verifyWaiting returned")
		})
	}
}
