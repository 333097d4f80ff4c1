package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/openconstellation/constellation/internal/clusterrecord"
	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/deploy"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/state"
	"github.com/openconstellation/constellation/pkg/untrusted"
)

// statusReport is `constellation status -o json`. Each view is gathered on its own: a view
// that cannot be had (no kubeconfig, the API server down, the cluster stopped) is reported as
// an error of that view, and the others are still shown.
type statusReport struct {
	Cluster  clusterStatus   `json:"cluster"`
	Nodes    []nodeStatus    `json:"nodes"`
	Removed  []removedStatus `json:"removed,omitempty"`
	Services []serviceStatus `json:"services,omitempty"`
	// Errors are the views that could not be had, with why.
	Errors []string `json:"errors,omitempty"`
}

type clusterStatus struct {
	Name      string `json:"name"`
	Provider  string `json:"provider"`
	Phase     string `json:"phase"`
	ClusterID string `json:"clusterID,omitempty"`
	APIServer string `json:"apiServer,omitempty"`
}

type nodeStatus struct {
	Name        string             `json:"name"`
	Role        string             `json:"role"`
	IP          string             `json:"ip"`
	Unexpected  bool               `json:"unexpected,omitempty"`
	Disk        string             `json:"disk,omitempty"` // as recorded in the state file: the one disk whose key recover sends
	Provider    *providerView      `json:"provider,omitempty"`
	Kubernetes  *kubernetesView    `json:"kubernetes,omitempty"`
	Attestation *attestationStatus `json:"attestation,omitempty"`
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
			r, err := clusterStatusReport(ctx, ws, !noVerify)
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
	cmd.Flags().DurationVar(&timeout, "timeout", time.Minute, "give up after this long")
	cmd.Flags().BoolVar(&noVerify, "no-verify", false, "skip the attestation view (no fresh evidence is asked for)")
	return cmd
}

func clusterStatusReport(ctx context.Context, workspace string, withAttestation bool) (*statusReport, error) {
	st, platform, err := loadState(workspace)
	if err != nil {
		return nil, err
	}
	r := &statusReport{Cluster: clusterStatus{Name: st.Name, Provider: st.Provider, Phase: string(st.Phase), APIServer: st.APIServerEndpoint}}
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

	// The platform's view.
	running := false
	if nodes, err := platform.Nodes(ctx); err != nil {
		r.Errors = append(r.Errors, "platform: "+err.Error())
	} else {
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
			running = running || n.State == provider.Running
		}
	}
	if !running {
		r.Errors = append(r.Errors, "the cluster is not running: Kubernetes and attestation views skipped")
		return r, nil
	}

	var wg sync.WaitGroup
	var mu sync.Mutex
	// Kubernetes' view, if the workspace has the admin kubeconfig.
	wg.Add(1)
	go func() {
		defer wg.Done()
		errs, services := kubernetesStatus(ctx, workspace, byName, &mu)
		mu.Lock()
		r.Errors = append(r.Errors, errs...)
		r.Services = services
		mu.Unlock()
	}()
	// The attestation view: fresh evidence of every node, in parallel.
	if withAttestation && st.Phase == state.Initialized {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := attestationStatusOf(ctx, workspace, st, byName, &mu); err != nil {
				mu.Lock()
				r.Errors = append(r.Errors, "attestation: "+err.Error())
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	// Every status refreshes the state file's disk records, so that they are there when a
	// power cut takes the cluster down without anyone running stop.
	if st.Phase == state.Initialized {
		if _, err := os.Stat(filepath.Join(workspace, AdminConfFile)); err == nil {
			r.Errors = append(r.Errors, statusDisks(ctx, workspace, st)...)
			for _, n := range st.Nodes {
				byName[n.Name].Disk = n.Disk
			}
		}
	}
	return r, nil
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

func kubernetesStatus(ctx context.Context, workspace string, byName map[string]*nodeStatus, mu *sync.Mutex) ([]string, []serviceStatus) {
	path := filepath.Join(workspace, AdminConfFile)
	if _, err := os.Stat(path); err != nil {
		return []string{"kubernetes: no admin kubeconfig (" + AdminConfFile + "): Kubernetes view skipped"}, nil
	}
	client, err := newKubeClient(path)
	if err != nil {
		return []string{"kubernetes: " + err.Error()}, nil
	}
	kctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	nodes, err := client.CoreV1().Nodes().List(kctx, metav1.ListOptions{})
	if err != nil {
		return []string{"kubernetes: listing nodes: " + untrusted.Text(err.Error())}, nil
	}
	var errs []string
	mu.Lock()
	for _, ns := range byName {
		ns.Kubernetes = &kubernetesView{}
	}
	for _, n := range nodes.Items {
		ns, ok := byName[n.Name]
		if !ok {
			errs = append(errs, fmt.Sprintf("kubernetes: node %s is not in %s", n.Name, state.FileName))
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
	mu.Unlock()
	var services []serviceStatus
	ds, err := client.AppsV1().DaemonSets(clusterrecord.Namespace).List(kctx, metav1.ListOptions{})
	if err != nil {
		return append(errs, "kubernetes: listing the services: "+untrusted.Text(err.Error())), nil
	}
	for _, name := range []string{deploy.JoinService, deploy.KeyService, deploy.VerificationService} {
		s := serviceStatus{Name: name}
		for _, d := range ds.Items {
			if d.Labels["app.kubernetes.io/name"] == name || d.Name == name {
				s.Desired, s.Ready = d.Status.DesiredNumberScheduled, d.Status.NumberReady
			}
		}
		services = append(services, s)
	}
	return errs, services
}

func attestationStatusOf(ctx context.Context, workspace string, st *state.State, byName map[string]*nodeStatus, mu *sync.Mutex) error {
	conf, err := config.Load(filepath.Join(workspace, config.FileName))
	if err != nil {
		return err
	}
	verifier, err := newVerifier(ctx, workspace, conf, st)
	if err != nil {
		return err
	}
	vctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, n := range st.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := &attestationStatus{CheckedAt: time.Now().UTC()}
			res, err := verifier.Verify(vctx, n.Name, nodeEndpoint(n, provider.VerificationPort))
			if err != nil {
				a.Error = err.Error()
			} else {
				a.Verified = true
				a.ReferenceSet = res.ReferenceSet
			}
			mu.Lock()
			byName[n.Name].Attestation = a
			mu.Unlock()
		}()
	}
	wg.Wait()
	return nil
}

func printStatus(out io.Writer, r *statusReport) {
	fmt.Fprintf(out, "Cluster %s (%s provider, %s", r.Cluster.Name, r.Cluster.Provider, r.Cluster.Phase)
	if r.Cluster.ClusterID != "" {
		fmt.Fprintf(out, ", ID %s", r.Cluster.ClusterID)
	}
	fmt.Fprintln(out, ")")
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tROLE\tIP\tPLATFORM\tKUBERNETES\tATTESTATION")
	for _, n := range r.Nodes {
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
	for _, n := range r.Nodes {
		if p := n.Provider; p != nil && (p.Detail != "" || p.ReportedDetail != "" || len(p.Events) > 1) {
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
