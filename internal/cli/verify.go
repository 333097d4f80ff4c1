package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/deploy"
	"github.com/openconstellation/constellation/internal/retry"
	"github.com/openconstellation/constellation/internal/state"
	"github.com/openconstellation/constellation/pkg/verify"
)

// verifyOptions are the flags of verify.
type verifyOptions struct {
	nodes    []string
	endpoint string
	output   string
	timeout  time.Duration
	// wait is how long a node whose verification service does not answer is asked again.
	wait time.Duration
}

func newVerifyCmd() *cobra.Command {
	var o verifyOptions
	cmd := &cobra.Command{
		Use:   "verify",
		Short: "Verify the cluster's nodes by remote attestation",
		Long: `Ask each node's verification service for evidence bound to a fresh random nonce, and
check it against the workspace's configuration: the signature of the node's attestation key
(certified by the platform's AK CA), the reference values of constellation-conf.yaml, and
PCR 15, which must carry the marker of the cluster ID recorded in constellation-state.yaml.
Nothing the cluster says is trusted: the nonce, the reference values and the cluster ID are
the workspace's own.

By default every node of constellation-state.yaml is verified; --node picks some, --endpoint
verifies one verification service by address (as the node --node names, or the node of the
state with that address). Evidence counts for a node only if its signing key is certified by
the platform for that node's name: a node that relays another node's evidence fails.
A node whose verification service does not answer (connection refused, unavailable, busy:
the service restarting, the node rebooting) is asked again for up to --wait, with a line on
standard error every 5 s saying what verify waits for; evidence that was refused fails at
once. Exits non-zero unless every node verified.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ws, _ := cmd.Flags().GetString("workspace")
			if o.output != "text" && o.output != "json" {
				return fmt.Errorf("--output %q: want text or json", o.output)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), o.timeout)
			defer cancel()
			return runVerify(ctx, cmd.OutOrStdout(), cmd.ErrOrStderr(), ws, o)
		},
	}
	cmd.Flags().StringSliceVar(&o.nodes, "node", nil, "verify only these nodes (names from constellation-state.yaml; repeatable)")
	cmd.Flags().StringVar(&o.endpoint, "endpoint", "", "verify the verification service at host:port instead of the state's nodes")
	cmd.Flags().StringVarP(&o.output, "output", "o", "text", "output format: text or json")
	cmd.Flags().DurationVar(&o.timeout, "timeout", 2*time.Minute, "give up after this long")
	cmd.Flags().DurationVar(&o.wait, "wait", time.Minute, "ask a node whose verification service does not answer again for up to this long (0: once)")
	return cmd
}

// verifyTarget is one verification service to ask.
type verifyTarget struct {
	Node     string `json:"node,omitempty"`
	Endpoint string `json:"endpoint"`
}

// verifyReport is the outcome for one target (the -o json array's element).
type verifyReport struct {
	verifyTarget
	Verified bool           `json:"verified"`
	Error    string         `json:"error,omitempty"`
	Result   *verify.Result `json:"result,omitempty"`
}

func runVerify(ctx context.Context, out, errOut io.Writer, workspace string, o verifyOptions) error {
	conf, err := config.Load(filepath.Join(workspace, config.FileName))
	if err != nil {
		return err
	}
	st, err := state.Load(filepath.Join(workspace, state.FileName))
	if err != nil {
		return err
	}
	if st.Phase != state.Initialized {
		return fmt.Errorf("%s: the cluster is %s, not initialized: nothing carries a cluster ID yet (run 'constellation apply')", state.FileName, st.Phase)
	}
	targets, err := verifyTargets(st, o)
	if err != nil {
		return err
	}
	verifier, err := newVerifier(ctx, workspace, conf, st)
	if err != nil {
		return err
	}

	reports := make([]verifyReport, 0, len(targets))
	failed := 0
	prog := newProgress(newPhaseTimer(newSyncWriter(errOut)))
	stop := prog.start(ctx)
	defer stop()
	for _, target := range targets {
		r := verifyReport{verifyTarget: target}
		res, err := verifyWaiting(ctx, prog, target, o.wait, verifier.Verify)
		r.Result = res
		if err != nil {
			r.Error = err.Error()
			failed++
		} else {
			r.Verified = true
		}
		reports = append(reports, r)
		if o.output == "text" {
			printVerifyReport(out, r)
		}
	}
	if o.output == "json" {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(reports); err != nil {
			return err
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d nodes failed verification", failed, len(targets))
	}
	if o.output == "text" {
		fmt.Fprintf(out, "%d of %d nodes verified: cluster %s (%x)\n", len(targets), len(targets), st.Name, []byte(st.ClusterID))
	}
	return nil
}

// verifyRetry is the back-off between attempts at a node that did not answer (tests shorten it).
var verifyRetry = retry.Default

// verifyWaiting verifies target with verifyFn, asking again for up to wait while the node's
// verification service does not answer (retry.Transient: refused or lost connections,
// Unavailable, ResourceExhausted, timeouts). A restarting service or a rebooting node is back
// within seconds, and an operator who runs verify right then wants its answer, not a failure.
// An answer that was checked and failed (evidence refused, another node's evidence, another
// cluster's marker) is never retried. A node that never answers fails with the first and the
// last error, and what to do.
func verifyWaiting(ctx context.Context, prog *progress, target verifyTarget, wait time.Duration,
	verifyFn func(ctx context.Context, node, endpoint string) (*verify.Result, error),
) (*verify.Result, error) {
	name := target.Node
	prog.waiting(name, "its verification service at "+target.Endpoint+" to answer")
	defer prog.done(name)
	retryable := func(err error) bool { return wait > 0 && retry.Transient(err) }
	wctx := ctx
	if wait > 0 {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, wait)
		defer cancel()
	}
	var res *verify.Result
	var answered bool
	err := retry.Do(wctx, verifyRetry, func(err error) bool { return !answered && retryable(err) }, func(ctx context.Context) error {
		var err error
		res, err = verifyFn(ctx, target.Node, target.Endpoint)
		// A result means the node answered and its evidence was checked: final.
		answered = res != nil
		prog.failed(name, err)
		return err
	})
	if err != nil && !answered && retry.Transient(err) {
		waited := ""
		if wait > 0 {
			waited = fmt.Sprintf(" within %s", wait)
		}
		return res, fmt.Errorf("%w; the verification service of %s did not answer%s: check the node with 'constellation status' "+
			"(is it running and Ready, are the verification service's pods ready?), then run 'constellation verify' again", err, name, waited)
	}
	return res, err
}

// verifyTargets are the verification services to ask: the state's nodes (those --node
// names), or --endpoint. Every target names the node whose evidence it must return: the
// evidence is tied to the node by its certified signer (verify.Verifier.Verify), so an
// --endpoint is verified as the node --node names, or as the state's node with that address.
func verifyTargets(st *state.State, o verifyOptions) ([]verifyTarget, error) {
	known := make([]string, 0, len(st.Nodes))
	for _, n := range st.Nodes {
		known = append(known, n.Name)
	}
	if o.endpoint != "" {
		host, _, err := net.SplitHostPort(o.endpoint)
		if err != nil {
			return nil, fmt.Errorf("--endpoint %q: %w", o.endpoint, err)
		}
		switch len(o.nodes) {
		case 0:
			for _, n := range st.Nodes {
				for _, ip := range n.IPs {
					if ip.String() == host {
						return []verifyTarget{{Node: n.Name, Endpoint: o.endpoint}}, nil
					}
				}
			}
			return nil, fmt.Errorf("--endpoint %s: no node of %s has address %s; name the node the endpoint must answer for with --node", o.endpoint, state.FileName, host)
		case 1:
			if !slices.Contains(known, o.nodes[0]) {
				return nil, fmt.Errorf("--node %s: no such node in %s (nodes: %s)", o.nodes[0], state.FileName, strings.Join(known, ", "))
			}
			return []verifyTarget{{Node: o.nodes[0], Endpoint: o.endpoint}}, nil
		default:
			return nil, errors.New("--endpoint verifies one node: give at most one --node")
		}
	}
	var targets []verifyTarget
	for _, n := range st.Nodes {
		if len(o.nodes) > 0 && !slices.Contains(o.nodes, n.Name) {
			continue
		}
		if len(n.IPs) == 0 {
			return nil, fmt.Errorf("%s: node %s has no address", state.FileName, n.Name)
		}
		targets = append(targets, verifyTarget{Node: n.Name, Endpoint: net.JoinHostPort(n.IPs[0].String(), fmt.Sprint(deploy.VerificationGRPCPort))})
	}
	for _, name := range o.nodes {
		if !slices.Contains(known, name) {
			return nil, fmt.Errorf("--node %s: no such node in %s (nodes: %s)", name, state.FileName, strings.Join(known, ", "))
		}
	}
	if len(targets) == 0 {
		return nil, fmt.Errorf("%s lists no nodes", state.FileName)
	}
	return targets, nil
}

// newVerifier builds the verifier from the workspace: the cluster's attestation policy
// (clusterAttestation), the state's cluster ID, and the way to reach the nodes.
func newVerifier(ctx context.Context, workspace string, conf *config.Config, st *state.State) (*verify.Verifier, error) {
	// The nodes' addresses may live in the cluster's private network: dial through the
	// platform, as the CLI does for init.
	platform, err := platformOf(workspace, st)
	if err != nil {
		return nil, err
	}
	_, validator, err := clusterAttestation(ctx, platform, conf)
	if err != nil {
		return nil, err
	}
	dialOpts := []grpc.DialOption{grpc.WithContextDialer(platform.Dialer())}
	return &verify.Verifier{Validator: validator, ClusterID: st.ClusterID, DialOptions: dialOpts}, nil
}

func printVerifyReport(out io.Writer, r verifyReport) {
	name := r.Node
	if name == "" {
		name = r.Endpoint
	}
	if !r.Verified {
		fmt.Fprintf(out, "FAIL  %s (%s): %s\n", name, r.Endpoint, r.Error)
		return
	}
	res := r.Result
	signer := "AK not certified"
	if res.Signer.Certified {
		signer = "AK certified"
		if res.Signer.Name != "" {
			signer += " for " + res.Signer.Name
		}
	}
	fmt.Fprintf(out, "OK    %s (%s): %s evidence, reference set %q, %s, %s carries cluster %s\n",
		name, r.Endpoint, res.Variant, res.ReferenceSet, signer, res.ClusterID.Register, res.ClusterID.ClusterID)
	if hw := res.Hardware; hw != nil {
		fmt.Fprintf(out, "      hardware: %s on %s, signed by %s, TCB %s, matched %q\n", hw.Technology, hw.Product, hw.Signer, hw.TCB, hw.Reference)
		for _, w := range hw.Warnings {
			fmt.Fprintf(out, "      warning: %s\n", w)
		}
	}
	for _, w := range res.Warnings {
		fmt.Fprintf(out, "      warning: %s\n", w)
	}
}
