package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/openconstellation/constellation/internal/clusterrecord"
	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/deploy"
	"github.com/openconstellation/constellation/internal/kube/kubeupgrade"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/nodeauthz"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/state"
	"github.com/openconstellation/constellation/pkg/untrusted"
	"github.com/openconstellation/constellation/pkg/verify"
)

// statusReport is `constellation status -o json`. Each view is gathered on its own: a view
// that cannot be had (no kubeconfig, the API server down, the cluster stopped) is reported as
// an error of that view, and the others are still shown.
type statusReport struct {
	Cluster clusterStatus `json:"cluster"`
	// ControlPlane is the control planes' health, as Kubernetes and the control planes'
	// reports say it; absent when the Kubernetes view could not be had.
	ControlPlane *controlPlaneHealth `json:"controlPlane,omitempty"`
	Nodes        []nodeStatus        `json:"nodes"`
	Removed      []removedStatus     `json:"removed,omitempty"`
	Services     []serviceStatus     `json:"services,omitempty"`
	// Errors are the views that could not be had, with why.
	Errors []string `json:"errors,omitempty"`
}

type clusterStatus struct {
	Name      string `json:"name"`
	Provider  string `json:"provider"`
	Phase     string `json:"phase"`
	ClusterID string `json:"clusterID,omitempty"`
	APIServer string `json:"apiServer,omitempty"`
	// Release is the signed release every node boots (the state file's), empty if none;
	// each node's matched reference set (named by its release) says what it runs.
	Release string `json:"release,omitempty"`
	// Kubernetes is the control plane's version (kubeadm's cluster configuration), AddOns
	// kube-proxy's: they differ while an upgrade moves the cluster to a new version
	// (docs/upgrades.md "Kubernetes upgrades").
	Kubernetes string `json:"kubernetes,omitempty"`
	AddOns     string `json:"addOns,omitempty"`
}

type nodeStatus struct {
	Name       string          `json:"name"`
	Role       string          `json:"role"`
	IP         string          `json:"ip"`
	Unexpected bool            `json:"unexpected,omitempty"`
	Disk       string          `json:"disk,omitempty"` // as recorded in the state file: the one disk whose key recover sends
	Provider   *providerView   `json:"provider,omitempty"`
	Kubernetes *kubernetesView `json:"kubernetes,omitempty"`
	// Authorizer is a control plane's removed-node authorizer, as its report says.
	Authorizer  *authorizerView    `json:"removedNodeAuthorizer,omitempty"`
	Attestation *attestationStatus `json:"attestation,omitempty"`
}

// authorizerView is a control plane's removed-node authorizer (internal/nodeauthz), as the
// control plane reports it into the cluster.
type authorizerView struct {
	// Ready: a fresh report says it has listed the removal records and serves.
	Ready bool `json:"ready"`
	// Detail is what the report says, or why there is none or it is stale.
	Detail     string     `json:"detail"`
	ReportedAt *time.Time `json:"reportedAt,omitempty"`
}

// controlPlaneHealth is whether every control plane is whole: registered and Ready, and its
// removed-node authorizer ready. The authorizer fails open (a removed node's reads are decided
// by the Node authorizer alone while it is down), so a control plane without it is degraded
// even though the cluster works.
type controlPlaneHealth struct {
	Healthy bool `json:"healthy"`
	// Problems name each control plane that is not whole, and why.
	Problems []string `json:"problems,omitempty"`
}

// providerView is the platform's view of a node.
type providerView struct {
	State    provider.NodeState `json:"state"`
	Reported string             `json:"reported,omitempty"`
	// ReportedDetail explains Reported (why the TPM cannot quote, when that clears).
	ReportedDetail string           `json:"reportedDetail,omitempty"`
	Detail         string           `json:"detail,omitempty"`
	Boots          int              `json:"boots"`
	BootedAt       *time.Time       `json:"bootedAt,omitempty"`
	Events         []provider.Event `json:"events,omitempty"`
}

// kubernetesView is Kubernetes' view of a node.
type kubernetesView struct {
	Registered bool   `json:"registered"`
	Ready      bool   `json:"ready"`
	Reason     string `json:"reason,omitempty"`
	Version    string `json:"version,omitempty"`
}

// attestationStatus is fresh evidence of the node, checked as `constellation verify` does.
type attestationStatus struct {
	Verified     bool      `json:"verified"`
	ReferenceSet string    `json:"referenceSet,omitempty"`
	Error        string    `json:"error,omitempty"`
	CheckedAt    time.Time `json:"checkedAt"`
}

type removedStatus struct {
	Name      string    `json:"name"`
	Role      string    `json:"role"`
	RemovedAt time.Time `json:"removedAt"`
	Admission string    `json:"admission"`
}

type serviceStatus struct {
	Name    string `json:"name"`
	Desired int32  `json:"desired"`
	Ready   int32  `json:"ready"`
}

func newStatusCmd() *cobra.Command {
	var output string
	var timeout time.Duration
	var noVerify bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the cluster's nodes as the platform, Kubernetes and attestation see them",
		Long: `Show every node of the workspace's cluster three ways:

  - the platform's view: running, rebooting, stopped or failed, what the node's bootstrapper
    reported (booting, joined, rejoined, waiting-for-join-service, waiting-for-recovery, ...)
    and the platform's recent events (such as a reboot after the node's bootstrapper died);
  - Kubernetes' view: registered, Ready, kubelet version;
  - the attestation view: fresh evidence from the node's verification service, checked against
    the workspace's reference values and cluster ID, and the reference set it matched.

Also the in-cluster services' health and the nodes removed from the cluster (refused from then
on). Views that cannot be had (no admin kubeconfig, the cluster stopped) are reported as such;
the others are still shown.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ws, err := absWorkspace(cmd)
			if err != nil {
				return err
			}
			if output != "text" && output != "json" {
				return fmt.Errorf("--output %q: want text or json", output)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			r, err := clusterStatusReport(ctx, ws, !noVerify, timeout)
			if err != nil {
				return err
			}
			if output == "json" {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(r)
			}
			printStatus(cmd.OutOrStdout(), r)
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")
	cmd.Flags().DurationVar(&timeout, "timeout", DefaultStatusTimeout, "answer within this long: a view that has not answered by then is reported as such")
	cmd.Flags().BoolVar(&noVerify, "no-verify", false, "skip the attestation view (no fresh evidence is asked for)")
	return cmd
}

// DefaultStatusTimeout is status's budget: it answers within it whatever is down. Each view
// gets the budget less statusMargin as its own deadline, the margin being for assembling and
// printing the report.
const (
	DefaultStatusTimeout = 2 * time.Second
	statusMargin         = 250 * time.Millisecond
)

func clusterStatusReport(ctx context.Context, workspace string, withAttestation bool, budget time.Duration) (*statusReport, error) {
	st, platform, err := loadState(workspace)
	if err != nil {
		return nil, err
	}
	return statusOf(ctx, workspace, st, platform, withAttestation, budget)
}

// statusView is one view of status, gathered on its own with its own deadline. run computes
// into its own variables and returns how to merge them into the report (merge runs only if
// the view answered in time, on the caller's goroutine).
type statusView struct {
	name string
	// what names who did not answer when the view times out.
	what string
	run  func(ctx context.Context) (merge func(r *statusReport, byName map[string]*nodeStatus))
}

// gatherViews runs views in parallel, each with a context whose deadline is deadline from
// now, and returns the merges of those that answered by then (in the order of views) and a
// note for each that did not. It does not wait for a view past its deadline: a view that
// ignores its context is abandoned, and what it computes later is dropped.
func gatherViews(ctx context.Context, deadline time.Duration, views []statusView) (merges []func(*statusReport, map[string]*nodeStatus), notes []string) {
	type result struct {
		i     int
		merge func(*statusReport, map[string]*nodeStatus)
	}
	ctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	results := make(chan result, len(views))
	for i, v := range views {
		go func() {
			results <- result{i: i, merge: v.run(ctx)}
		}()
	}
	got := make([]func(*statusReport, map[string]*nodeStatus), len(views))
	answered := make([]bool, len(views))
	for range views {
		select {
		case res := <-results:
			got[res.i], answered[res.i] = res.merge, true
			continue
		case <-ctx.Done():
		}
		break
	}
	for i, v := range views {
		if !answered[i] {
			notes = append(notes, fmt.Sprintf("%s: no answer within %s: %s did not answer", v.name, deadline.Round(time.Millisecond), v.what))
			continue
		}
		if got[i] != nil {
			merges = append(merges, got[i])
		}
	}
	return merges, notes
}

// statusOf gathers the views of status in parallel, each within budget (less statusMargin):
// the platform's, Kubernetes', the attestation view and the refresh of the disk records.
// A view that fails or does not answer in time becomes a note; the others are still shown.
// In order:
//
//  1. the report starts from what the state file knows;
//  2. every view runs at once, each with the same deadline;
//  3. the views that answered are merged into the report, the others become notes;
//  4. if the platform says nothing runs, the other views are dropped.
func statusOf(ctx context.Context, workspace string, st *state.State, platform provider.Provider, withAttestation bool, budget time.Duration) (*statusReport, error) {
	r, byName := statusFromState(st)
	// Whether the cluster runs is the platform's to say; the other views do not wait for it
	// (it may be the one that hangs) but are dropped when it says nothing runs.
	var pv platformAnswer
	views := append([]statusView{platformStatusView(st, platform, &pv)}, clusterStatusViews(workspace, st, platform, withAttestation)...)
	merges, notes := gatherViews(ctx, max(budget-statusMargin, budget/2), views)
	for _, m := range merges {
		m(r, byName)
	}
	r.Errors = append(r.Errors, notes...)
	if pv.answered && !pv.running {
		skipStoppedViews(r)
	}
	return r, nil
}

// statusFromState is the report as far as the state file knows it, and its nodes by name.
func statusFromState(st *state.State) (*statusReport, map[string]*nodeStatus) {
	r := &statusReport{Cluster: clusterStatus{Name: st.Name, Provider: st.Provider, Phase: string(st.Phase), APIServer: st.APIServerEndpoint, Release: st.Release}}
	if st.Phase == state.Initialized {
		r.Cluster.ClusterID = fmt.Sprintf("%x", []byte(st.ClusterID))
	}
	byName := map[string]*nodeStatus{}
	for _, n := range st.Nodes {
		r.Nodes = append(r.Nodes, nodeStatus{Name: n.Name, Role: string(n.Role), IP: n.IPs[0].String(), Unexpected: n.Unexpected, Disk: n.Disk})
	}
	for i := range r.Nodes {
		byName[r.Nodes[i].Name] = &r.Nodes[i]
	}
	for _, rm := range st.Removed {
		r.Removed = append(r.Removed, removedStatus{Name: rm.Name, Role: string(rm.Role), RemovedAt: rm.RemovedAt, Admission: "refused: removed from the cluster"})
	}
	return r, byName
}

// platformAnswer is what the platform view said, once merged: whether it answered without
// an error, and whether any node runs.
type platformAnswer struct{ answered, running bool }

// platformStatusView is the platform's view of every node; its merge records in pv whether
// the cluster runs.
func platformStatusView(st *state.State, platform provider.Provider, pv *platformAnswer) statusView {
	return statusView{
		name: "platform", what: "the platform (" + st.Provider + " provider)",
		run: func(ctx context.Context) func(*statusReport, map[string]*nodeStatus) {
			nodes, err := platform.Nodes(ctx)
			return func(r *statusReport, byName map[string]*nodeStatus) {
				if err != nil {
					r.Errors = append(r.Errors, "platform: "+err.Error())
					return
				}
				pv.answered = true
				for _, n := range nodes {
					ns, ok := byName[n.Name]
					if !ok {
						r.Errors = append(r.Errors, fmt.Sprintf("platform: node %s is not in %s", n.Name, state.FileName))
						continue
					}
					v := &providerView{State: n.State, Reported: n.Reported, ReportedDetail: n.ReportedDetail, Detail: n.Detail, Boots: n.Boots, Events: n.Events}
					if !n.BootedAt.IsZero() {
						b := n.BootedAt
						v.BootedAt = &b
					}
					ns.Provider = v
					pv.running = pv.running || n.State == provider.Running
				}
			}
		},
	}
}

// clusterStatusViews are the views that ask the cluster itself: Kubernetes, the nodes'
// attestation (if asked for and initialized) and the refresh of the disk records (if
// initialized and the workspace has the admin kubeconfig).
func clusterStatusViews(workspace string, st *state.State, platform provider.Provider, withAttestation bool) []statusView {
	_, confErr := os.Stat(filepath.Join(workspace, AdminConfFile))
	kubeWhat := "the Kubernetes API server"
	if st.APIServerEndpoint != "" {
		kubeWhat += " at " + st.APIServerEndpoint
	}
	views := []statusView{{
		name: "kubernetes", what: kubeWhat,
		run: func(ctx context.Context) func(*statusReport, map[string]*nodeStatus) {
			return kubernetesStatus(ctx, workspace)
		},
	}}
	if withAttestation && st.Phase == state.Initialized {
		views = append(views, statusView{
			name: "attestation", what: "the nodes' verification services",
			run: func(ctx context.Context) func(*statusReport, map[string]*nodeStatus) {
				return attestationStatusOf(ctx, workspace, st, platform)
			},
		})
	}
	// Every status refreshes the state file's disk records, so that they are there when a
	// power cut takes the cluster down without anyone running stop. It works on a copy: the
	// other views read st meanwhile.
	if st.Phase == state.Initialized && confErr == nil {
		views = append(views, statusView{
			name: "disks", what: kubeWhat + " (disk records)",
			run: func(ctx context.Context) func(*statusReport, map[string]*nodeStatus) {
				cp := *st
				cp.Nodes = slices.Clone(st.Nodes)
				notes := statusDisks(ctx, workspace, &cp)
				return func(r *statusReport, byName map[string]*nodeStatus) {
					r.Errors = append(r.Errors, notes...)
					for _, n := range cp.Nodes {
						byName[n.Name].Disk = n.Disk
					}
				}
			},
		})
	}
	return views
}

// skipStoppedViews drops what the other views said of a stopped cluster: they could only say
// that nothing answers.
func skipStoppedViews(r *statusReport) {
	for i := range r.Nodes {
		r.Nodes[i].Kubernetes, r.Nodes[i].Attestation, r.Nodes[i].Authorizer = nil, nil, nil
	}
	r.Services, r.ControlPlane = nil, nil
	kept := r.Errors[:0]
	for _, e := range r.Errors {
		if strings.HasPrefix(e, "platform") {
			kept = append(kept, e)
		}
	}
	r.Errors = append(kept, "the cluster is not running: Kubernetes and attestation views skipped")
}

// kubernetesStatus is Kubernetes' view: the nodes and the in-cluster services, if the
// workspace has the admin kubeconfig.
func kubernetesStatus(ctx context.Context, workspace string) func(*statusReport, map[string]*nodeStatus) {
	fail := func(msg string) func(*statusReport, map[string]*nodeStatus) {
		return func(r *statusReport, _ map[string]*nodeStatus) { r.Errors = append(r.Errors, msg) }
	}
	path := filepath.Join(workspace, AdminConfFile)
	if _, err := os.Stat(path); err != nil {
		return fail("kubernetes: no admin kubeconfig (" + AdminConfFile + "): Kubernetes view skipped")
	}
	client, err := newKubeClient(path)
	if err != nil {
		return fail("kubernetes: " + err.Error())
	}
	return kubernetesStatusOf(ctx, client, time.Now())
}

// kubernetesStatusOf is Kubernetes' view as client sees it at now.
func kubernetesStatusOf(ctx context.Context, client kubernetes.Interface, now time.Time) func(*statusReport, map[string]*nodeStatus) {
	fail := func(msg string) func(*statusReport, map[string]*nodeStatus) {
		return func(r *statusReport, _ map[string]*nodeStatus) { r.Errors = append(r.Errors, msg) }
	}
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fail("kubernetes: listing nodes: " + untrusted.Text(err.Error()))
	}
	ds, dsErr := client.AppsV1().DaemonSets(clusterrecord.Namespace).List(ctx, metav1.ListOptions{})
	clusterVersion, versionErr := kubeupgrade.ClusterVersion(ctx, client)
	addOns, addOnsErr := kubeupgrade.KubeProxyVersion(ctx, client)
	reports, reportsErr := nodeauthz.Reports(ctx, client)
	return func(r *statusReport, byName map[string]*nodeStatus) {
		defer func() { r.ControlPlane = controlPlaneHealthOf(r.Nodes, reportsErr) }()
		if err := errors.Join(versionErr, addOnsErr); err != nil {
			r.Errors = append(r.Errors, "kubernetes: "+untrusted.Text(err.Error()))
		}
		r.Cluster.Kubernetes, r.Cluster.AddOns = clusterVersion, addOns
		for _, ns := range byName {
			ns.Kubernetes = &kubernetesView{}
		}
		for _, n := range nodes.Items {
			ns, ok := byName[n.Name]
			if !ok {
				r.Errors = append(r.Errors, fmt.Sprintf("kubernetes: node %s is not in %s", n.Name, state.FileName))
				continue
			}
			// A node's kubelet writes its Node's status: version and reason are the node's text.
			v := &kubernetesView{Registered: true, Version: untrusted.Text(n.Status.NodeInfo.KubeletVersion)}
			if c := readyCondition(n); c != nil {
				v.Ready = c.Status == "True"
				if !v.Ready {
					v.Reason = untrusted.Text(c.Reason)
				}
			}
			ns.Kubernetes = v
		}
		if reportsErr == nil {
			for _, ns := range byName {
				if ns.Role == string(metadata.ControlPlane) {
					ns.Authorizer = authorizerViewOf(reports, ns.Name, now)
				}
			}
		}
		if dsErr != nil {
			r.Errors = append(r.Errors, "kubernetes: listing the services: "+untrusted.Text(dsErr.Error()))
			return
		}
		for _, name := range []string{deploy.JoinService, deploy.KeyService, deploy.VerificationService} {
			s := serviceStatus{Name: name}
			for _, d := range ds.Items {
				if d.Labels["app.kubernetes.io/name"] == name || d.Name == name {
					s.Desired, s.Ready = d.Status.DesiredNumberScheduled, d.Status.NumberReady
				}
			}
			r.Services = append(r.Services, s)
		}
	}
}

// authorizerViewOf is node's removed-node authorizer as reports say at now.
func authorizerViewOf(reports map[string]nodeauthz.Report, node string, now time.Time) *authorizerView {
	h := nodeauthz.Assess(reports, node, now)
	v := &authorizerView{Ready: h.Ready, Detail: h.Why}
	if rep, ok := reports[node]; ok {
		at := rep.RenewedAt.UTC()
		v.ReportedAt = &at
	}
	return v
}

// controlPlaneHealthOf is the control planes' health from what the Kubernetes view found of
// them (nodes' Kubernetes and Authorizer), reportsErr the failure to read the authorizers'
// reports.
func controlPlaneHealthOf(nodes []nodeStatus, reportsErr error) *controlPlaneHealth {
	h := &controlPlaneHealth{}
	for _, n := range nodes {
		if n.Role != string(metadata.ControlPlane) || n.Unexpected {
			continue
		}
		switch k := n.Kubernetes; {
		case k == nil || !k.Registered:
			h.Problems = append(h.Problems, n.Name+": not registered with Kubernetes")
		case !k.Ready:
			h.Problems = append(h.Problems, fmt.Sprintf("%s: NotReady (%s)", n.Name, k.Reason))
		}
		if a := n.Authorizer; a != nil && !a.Ready {
			h.Problems = append(h.Problems, fmt.Sprintf("%s: removed-node authorizer not ready: %s", n.Name, a.Detail))
		}
	}
	if reportsErr != nil {
		h.Problems = append(h.Problems, "removed-node authorizers unknown: "+untrusted.Text(reportsErr.Error()))
	}
	h.Healthy = len(h.Problems) == 0
	return h
}

// attestationStatusOf is the attestation view: fresh evidence of every node, in parallel.
func attestationStatusOf(ctx context.Context, workspace string, st *state.State, platform provider.Provider) func(*statusReport, map[string]*nodeStatus) {
	fail := func(err error) func(*statusReport, map[string]*nodeStatus) {
		return func(r *statusReport, _ map[string]*nodeStatus) {
			r.Errors = append(r.Errors, "attestation: "+err.Error())
		}
	}
	conf, err := config.Load(filepath.Join(workspace, config.FileName))
	if err != nil {
		return fail(err)
	}
	_, validator, err := clusterAttestation(ctx, platform, conf)
	if err != nil {
		return fail(err)
	}
	verifier := &verify.Verifier{Validator: validator, ClusterID: st.ClusterID, DialOptions: []grpc.DialOption{grpc.WithContextDialer(platform.Dialer())}}
	results := make([]*attestationStatus, len(st.Nodes))
	var wg sync.WaitGroup
	for i, n := range st.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := &attestationStatus{CheckedAt: time.Now().UTC()}
			res, err := verifier.Verify(ctx, n.Name, nodeEndpoint(n, provider.VerificationPort))
			if err != nil {
				a.Error = err.Error()
			} else {
				a.Verified = true
				a.ReferenceSet = res.ReferenceSet
			}
			results[i] = a
		}()
	}
	wg.Wait()
	return func(_ *statusReport, byName map[string]*nodeStatus) {
		for i, n := range st.Nodes {
			byName[n.Name].Attestation = results[i]
		}
	}
}

func printStatus(out io.Writer, r *statusReport) {
	printClusterLine(out, r.Cluster)
	printNodeTable(out, r.Nodes)
	printNodeDetails(out, r.Nodes)
	if cp := r.ControlPlane; cp != nil {
		if cp.Healthy {
			fmt.Fprintln(out, "Control plane: healthy (every control plane Ready, its removed-node authorizer synced)")
		} else {
			fmt.Fprintf(out, "Control plane: DEGRADED: %s\n", strings.Join(cp.Problems, "; "))
		}
	}
	if len(r.Services) > 0 {
		var parts []string
		for _, s := range r.Services {
			parts = append(parts, fmt.Sprintf("%s %d/%d ready", strings.TrimPrefix(s.Name, "constellation-"), s.Ready, s.Desired))
		}
		fmt.Fprintf(out, "Services: %s\n", strings.Join(parts, ", "))
	}
	for _, rm := range r.Removed {
		fmt.Fprintf(out, "Removed: %s (%s, %s): %s\n", rm.Name, rm.Role, rm.RemovedAt.Local().Format(time.RFC3339), rm.Admission)
	}
	for _, e := range r.Errors {
		fmt.Fprintf(out, "note: %s\n", e)
	}
}

// printClusterLine prints the status's first line: the cluster, its provider, phase, ID,
// release and Kubernetes version.
func printClusterLine(out io.Writer, c clusterStatus) {
	fmt.Fprintf(out, "Cluster %s (%s provider, %s", c.Name, c.Provider, c.Phase)
	if c.ClusterID != "" {
		fmt.Fprintf(out, ", ID %s", c.ClusterID)
	}
	if c.Release != "" {
		fmt.Fprintf(out, ", release %s", c.Release)
	}
	if c.Kubernetes != "" {
		fmt.Fprintf(out, ", Kubernetes %s", c.Kubernetes)
		if a := c.AddOns; a != "" && a != c.Kubernetes {
			fmt.Fprintf(out, " (add-ons still %s)", a)
		}
	}
	fmt.Fprintln(out, ")")
}

// printNodeTable prints one row per node: its three views.
func printNodeTable(out io.Writer, nodes []nodeStatus) {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tROLE\tIP\tPLATFORM\tKUBERNETES\tATTESTATION")
	for _, n := range nodes {
		platform := "unknown"
		if p := n.Provider; p != nil {
			platform = string(p.State)
			if p.Reported != "" {
				platform += " (" + p.Reported + ")"
			}
		}
		kube := "unknown"
		if k := n.Kubernetes; k != nil {
			switch {
			case !k.Registered:
				kube = "not registered"
			case k.Ready:
				kube = "Ready " + k.Version
			default:
				kube = "NotReady " + k.Reason
			}
		}
		att := "not checked"
		if a := n.Attestation; a != nil {
			if a.Verified {
				att = fmt.Sprintf("verified (set %q)", a.ReferenceSet)
			} else {
				att = "FAILED: " + firstLine(a.Error)
			}
		}
		name := n.Name
		if n.Unexpected {
			name += " (unexpected)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", name, n.Role, n.IP, platform, kube, att)
	}
	tw.Flush()
}

// printNodeDetails prints what the platform says of a node beyond its state: its detail,
// its bootstrapper's report and its last events.
func printNodeDetails(out io.Writer, nodes []nodeStatus) {
	for _, n := range nodes {
		p := n.Provider
		if p == nil || (p.Detail == "" && p.ReportedDetail == "" && len(p.Events) <= 1) {
			continue
		}
		if p.Detail != "" {
			fmt.Fprintf(out, "  %s: %s\n", n.Name, p.Detail)
		}
		if p.ReportedDetail != "" {
			fmt.Fprintf(out, "  %s: %s: %s\n", n.Name, p.Reported, p.ReportedDetail)
		}
		for _, e := range lastN(p.Events, 3) {
			fmt.Fprintf(out, "  %s  %s: %s\n", e.Time.Local().Format(time.TimeOnly), n.Name, e.Message)
		}
	}
}

func lastN[T any](s []T, n int) []T {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 120 {
		s = s[:120] + "…"
	}
	return s
}

// statusDisks refreshes the disk records and returns what status reports of it.
func statusDisks(ctx context.Context, workspace string, st *state.State) []string {
	client, err := newKubeClient(filepath.Join(workspace, AdminConfFile))
	if err != nil {
		return []string{"disks: " + err.Error()}
	}
	report, err := refreshDisks(ctx, workspace, st, client)
	if err != nil {
		return []string{"disks: could not refresh the disk records: " + err.Error()}
	}
	var notes []string
	for _, s := range report.Replaced {
		notes = append(notes, "disks: record replaced: "+s)
	}
	for _, s := range report.Problems {
		notes = append(notes, "disks: "+s)
	}
	return notes
}
