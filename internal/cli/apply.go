package cli

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/openconstellation/constellation/api/init/initpb"
	"github.com/openconstellation/constellation/internal/clusterrecord"
	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/deploy"
	"github.com/openconstellation/constellation/internal/fileutil"
	"github.com/openconstellation/constellation/internal/joinservice/refusals"
	"github.com/openconstellation/constellation/internal/kms"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/nodeauthz"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/state"
	"github.com/openconstellation/constellation/pkg/atls"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/untrusted"
	"github.com/openconstellation/constellation/pkg/untrusted/untrustedgrpc"
)

// Files the CLI writes into the workspace.
const (
	AdminConfFile    = "constellation-admin.conf"
	MasterSecretFile = "constellation-mastersecret.json"
)

// initAndWait initializes the cluster on its first control plane over attested TLS and waits
// until every node that should be admitted is Ready. In order:
//
//  1. build the init request: a new master secret, the provider's init secret and the
//     cluster's attestation (initRequest);
//  2. write the master secret into the workspace, before it leaves this machine;
//  3. initialize the first control plane over attested TLS (callInit);
//  4. write the admin kubeconfig and record the initialized cluster (recordInitialized);
//  5. record the init node's disk, wait for every expected node to be Ready and verifiable,
//     record the disks of the nodes that joined (waitForNodes);
//  6. report the nodes the join service refused as expected (reportUnexpected).
func initAndWait(ctx context.Context, out io.Writer, t *phaseTimer, workspace string, conf *config.Config, st *state.State) error {
	platform, err := platformOf(workspace, st)
	if err != nil {
		return err
	}
	ir, err := initRequest(ctx, workspace, conf, st, platform)
	if err != nil {
		return err
	}
	// The master secret is written before it leaves this machine: a lost answer must not
	// lose the key to the cluster's state.
	if err := kms.WriteMasterSecretFile(filepath.Join(workspace, MasterSecretFile), ir.master); err != nil {
		return fmt.Errorf("writing the master secret: %w", err)
	}
	first := st.Nodes[0]
	fmt.Fprintf(out, "initializing %s over attested TLS (it must prove it boots the expected image)\n", first.Name)
	success, err := callInit(ctx, out, st.InitEndpoint, ir.validator, platform.Dialer(), ir.req)
	if err != nil {
		return err
	}
	t.phase("init", fmt.Sprintf("%s initialized the cluster, ID %x", first.Name, success.ClusterId))
	adminConf, err := recordInitialized(workspace, st, success, ir.req.MeasurementSalt)
	if err != nil {
		return err
	}
	client, err := newKubeClient(adminConf)
	if err != nil {
		return err
	}
	if err := waitForNodes(ctx, out, t, workspace, st, client, platform); err != nil {
		return err
	}
	reportUnexpected(ctx, out, client, st.Nodes)
	warnServiceLB(ctx, out, workspace, st, client)
	fmt.Fprintf(out, "\nThe cluster is up. Use it with:\n  export KUBECONFIG=%s\n  %s get nodes\n  %s verify -C %s\nRemove it with: %s terminate --yes -C %s (or mini down, for a cluster of mini up)\n",
		adminConf, kubectlFor(conf.KubernetesVersion), toolPath("constellation"), workspace, toolPath("constellation"), workspace)
	return nil
}

// preparedInit is an init request with what checking and answering it needs.
type preparedInit struct {
	req       *initpb.InitRequest
	master    kms.MasterSecret
	validator attestation.Validator
}

// initRequest builds the init request of the cluster: a new master secret and measurement
// salt, the init secret the provider generated at create, and the attestation the cluster
// records (clusterAttestation), with the validator the first node is checked by.
func initRequest(ctx context.Context, workspace string, conf *config.Config, st *state.State, platform provider.Provider) (preparedInit, error) {
	p, err := providerOf(st)
	if err != nil {
		return preparedInit{}, err
	}
	initSecret, err := p.InitSecret(workspace)
	if err != nil {
		return preparedInit{}, err
	}
	ref, validator, err := clusterAttestation(ctx, platform, conf)
	if err != nil {
		return preparedInit{}, err
	}
	encodedRef, err := ref.Encode()
	if err != nil {
		return preparedInit{}, err
	}
	master, err := kms.NewMasterSecret()
	if err != nil {
		return preparedInit{}, err
	}
	salt := make([]byte, 32)
	if _, err := rand.Read(salt); err != nil {
		return preparedInit{}, err
	}
	mirrors, err := conf.RegistryMirrors.Encode()
	if err != nil {
		return preparedInit{}, fmt.Errorf("registryMirrors: %w", err)
	}
	req := &initpb.InitRequest{
		MasterSecret: master.Key, MasterSalt: master.Salt, MeasurementSalt: salt, RegistryMirrors: mirrors,
		InitSecret: initSecret, ClusterName: conf.Name, KubernetesVersion: conf.KubernetesVersion,
		ApiServerCertSans: apiServerSANs(st.APIServerEndpoint),
		ServiceCidr:       conf.Network.ServiceCIDR, PodCidr: conf.Network.PodCIDR,
		AttestationReference: encodedRef,
	}
	return preparedInit{req: req, master: master, validator: validator}, nil
}

// apiServerSANs are the names the API server's certificate must hold besides the ones its
// node adds (its addresses, the endpoint its metadata names): the host of the endpoint the
// CLI writes into the admin kubeconfig, so that the kubeconfig works whatever the platform's
// metadata says, and loopback for a tunnel.
func apiServerSANs(endpoint string) []string {
	sans := []string{"127.0.0.1", "localhost"}
	if host, _, err := net.SplitHostPort(endpoint); err == nil && host != "" && !slices.Contains(sans, host) {
		sans = append(sans, host)
	}
	return sans
}

// recordInitialized writes the admin kubeconfig of the init node's answer, pointed at the
// platform's API server endpoint, and records the initialized cluster in the state file. It
// returns the kubeconfig's path.
func recordInitialized(workspace string, st *state.State, success *initpb.InitSuccess, measurementSalt []byte) (string, error) {
	kubeconfig, err := clientcmd.Load(success.Kubeconfig)
	if err != nil {
		return "", fmt.Errorf("reading the admin kubeconfig: %w", err)
	}
	for _, c := range kubeconfig.Clusters {
		c.Server = "https://" + st.APIServerEndpoint
	}
	adminConf := filepath.Join(workspace, AdminConfFile)
	// The admin kubeconfig holds a cluster-admin client key: written 0600 from the start
	// (clientcmd.WriteToFile would keep the mode of an existing file and follow a symlink).
	adminConfData, err := clientcmd.Write(*kubeconfig)
	if err != nil {
		return "", fmt.Errorf("encoding the admin kubeconfig: %w", err)
	}
	if err := fileutil.WriteAtomic(adminConf, adminConfData, 0o600); err != nil {
		return "", fmt.Errorf("writing the admin kubeconfig: %w", err)
	}

	st.Phase, st.InitializedAt = state.Initialized, time.Now().UTC()
	st.ClusterID, st.MeasurementSalt = success.ClusterId, measurementSalt
	if err := state.Write(filepath.Join(workspace, state.FileName), st); err != nil {
		return "", err
	}
	return adminConf, nil
}

// waitForNodes records the init node's disk, waits until every node that should be admitted
// is Ready and verifiable, and then records the disks of the nodes that joined.
func waitForNodes(ctx context.Context, out io.Writer, t *phaseTimer, workspace string, st *state.State, client kubernetes.Interface, platform provider.Provider) error {
	// The init node's disk, recorded by the init server before it answered: recorded here at
	// once, so that a power cut while the other nodes join still leaves it recoverable.
	// The other nodes have not joined yet: only what was recorded is worth saying.
	if report, err := refreshDisks(ctx, workspace, st, client); err != nil {
		fmt.Fprintf(out, "WARNING: could not read the disk records yet (read again once every node is Ready): %v\n", err)
	} else {
		printDiskReport(out, state.DiskReport{Recorded: report.Recorded})
	}
	want := map[string]bool{}
	for _, n := range st.Nodes {
		if !n.Unexpected {
			want[n.Name] = true
		}
	}
	prog := newProgress(t)
	stop := prog.start(ctx)
	err := waitNodesReady(ctx, out, t, prog, client, platform, st.Nodes, want, false)
	stop()
	if err != nil {
		return err
	}
	// Every node that joined has its disk record now.
	report, err := refreshDisks(ctx, workspace, st, client)
	if err != nil {
		return fmt.Errorf("recording the nodes' disks (recover needs them; apply again to retry): %w", err)
	}
	printDiskReport(out, report)
	return nil
}

// reportUnexpected reports the nodes that are not expected to join (tests: another image),
// once the join service has refused them: such a node may be in its join back-off when the
// others are ready, so wait for its next attempt (bounded by rejectionWait).
func reportUnexpected(ctx context.Context, out io.Writer, client kubernetes.Interface, nodes []state.Node) {
	for _, n := range nodes {
		if n.Unexpected {
			fmt.Fprintf(out, "not admitted  %s (%s): %s\n", n.Name, n.IPs[0], waitRejected(ctx, client, n.IPs[0].String(), rejectionWait))
		}
	}
}

// pointKubeconfig points the workspace's admin kubeconfig at apiServer (host:port).
func pointKubeconfig(workspace, apiServer string) error {
	path := filepath.Join(workspace, AdminConfFile)
	kubeconfig, err := clientcmd.LoadFromFile(path)
	if err != nil {
		return fmt.Errorf("reading the admin kubeconfig: %w", err)
	}
	for _, c := range kubeconfig.Clusters {
		c.Server = "https://" + apiServer
	}
	data, err := clientcmd.Write(*kubeconfig)
	if err != nil {
		return fmt.Errorf("encoding the admin kubeconfig: %w", err)
	}
	return fileutil.WriteAtomic(path, data, 0o600)
}

// clusterAttestation is how a cluster's nodes are checked, by the CLI at init, verify,
// status and recover, and by the join service (it is sent with init): the configured
// variant's reference values, with the AK roots the platform certifies its nodes' keys with
// added to any the configuration names. The configured variant must be the platform's.
func clusterAttestation(ctx context.Context, platform provider.Provider, conf *config.Config) (choose.Reference, attestation.Validator, error) {
	ref, err := conf.Attestation.Reference()
	if err != nil {
		return choose.Reference{}, nil, err
	}
	pa, err := platform.Attestation(ctx)
	if err != nil {
		return choose.Reference{}, nil, err
	}
	if pa.Variant != ref.Variant {
		return choose.Reference{}, nil, fmt.Errorf("%s: attestation.%s: the platform's nodes attest with %s (attestation.%s)",
			config.FileName, ref.Variant.ConfigKey(), pa.Variant, pa.Variant.ConfigKey())
	}
	ref.AKRoots = string(pa.AKRootsPEM) + ref.AKRoots
	// The whole reference goes to the join service, so it admits nodes by what this CLI
	// verified the first node with: building the validator checks it once, by a cluster's
	// rules (the configuration file's check could not: the platform's roots were not in it).
	validator, err := choose.NewValidator(ref, choose.Options{Cluster: true})
	if err != nil {
		return choose.Reference{}, nil, fmt.Errorf("attestation: %w", err)
	}
	return ref, validator, nil
}

// callInit runs the Init RPC, printing progress lines, and returns the success message.
// Everything the node sends is its text: progress messages, the log it streams on failure
// and its error status reach the terminal as bounded lines with control characters escaped
// (pkg/untrusted), so a node cannot clear the operator's screen or forge output.
func callInit(ctx context.Context, out io.Writer, addr string, v attestation.Validator, dial func(context.Context, string) (net.Conn, error), req *initpb.InitRequest) (*initpb.InitSuccess, error) {
	atlsCreds, err := atls.NewCredentials(atls.Config{Validators: []attestation.Validator{v}})
	if err != nil {
		return nil, err
	}
	creds := atlsCreds.Recording()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(creds), grpc.WithContextDialer(untilListening(out, dial)))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	// WaitForReady: the node's init server may still be starting; the call waits for it
	// (within ctx) instead of failing on the first refused connection.
	stream, err := initpb.NewInitServiceClient(conn).Init(ctx, req, grpc.WaitForReady(true))
	if err != nil {
		return nil, initError(creds, err, false)
	}
	var logs untrusted.Log
	answered := false
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil, errors.New("init: the node ended the stream without a result")
		}
		if err != nil {
			if lines := logs.Lines(); len(lines) > 0 {
				fmt.Fprintln(out, "--- node logs ---")
				for _, l := range lines {
					fmt.Fprintln(out, l)
				}
			}
			return nil, initError(creds, err, answered)
		}
		answered = true
		switch k := msg.Kind.(type) {
		case *initpb.InitResponse_Progress:
			fmt.Fprintf(out, "  %s\n", untrusted.Text(k.Progress.Message))
		case *initpb.InitResponse_Log:
			_, _ = logs.Write(k.Log.Data)
		case *initpb.InitResponse_Success:
			return k.Success, nil
		}
	}
}

// initPoll is how often the CLI knocks at a node's init server while nothing listens there.
// A refused connection costs the node nothing; gRPC's own back-off (1 s, growing by 1.6×)
// noticed a node that took 13 s to boot 2.6 s late.
const initPoll = 250 * time.Millisecond

// untilListening wraps dial so that a connection attempt waits, knocking every initPoll, until
// something accepts the connection (the node booted and serves init), and says every 5 s what
// it waits for. gRPC's back-off then applies only to attempts that reached the node, such as
// a failed attested handshake, which the node's handshake limits count.
func untilListening(out io.Writer, dial func(context.Context, string) (net.Conn, error)) func(context.Context, string) (net.Conn, error) {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		start := time.Now()
		lastSaid := start
		for {
			conn, err := dial(ctx, addr)
			if err == nil || ctx.Err() != nil {
				return conn, err
			}
			if time.Since(lastSaid) >= 5*time.Second {
				lastSaid = time.Now()
				fmt.Fprintf(out, "  waiting for the node's init server at %s (%.0fs; the node is still booting: %v)\n", addr, time.Since(start).Seconds(), err)
			}
			select {
			case <-ctx.Done():
				return nil, err
			case <-time.After(initPoll):
			}
		}
	}
}

// initError says why the Init call failed. Before the node answered, a failed attested
// handshake is the likely cause, and gRPC reports it flattened into a status (Unavailable, or
// DeadlineExceeded for a call that waited): the handshake's own error is reported then, whole
// (every mismatching register). Otherwise the status is the node's, its message the node's
// text.
func initError(creds *atls.RecordingCredentials, err error, answered bool) error {
	code := status.Code(err)
	if hsErr := creds.LastError(); hsErr != nil && !answered && (code == codes.Unavailable || code == codes.DeadlineExceeded) {
		return fmt.Errorf("init: %s: %w", code, hsErr)
	}
	return fmt.Errorf("init: %w", untrustedgrpc.Status(err))
}

// waitNodesReady is waitReady, and on failure says why: what the join service refused of the
// nodes that are missing.
func waitNodesReady(ctx context.Context, out io.Writer, t *phaseTimer, prog *progress, client kubernetes.Interface, platform provider.Provider, nodes []state.Node, want map[string]bool, quietIfReady bool) error {
	controlPlanes := map[string]bool{}
	for _, n := range nodes {
		if n.Role == metadata.ControlPlane {
			controlPlanes[n.Name] = true
		}
	}
	err := waitReady(ctx, t, prog, client, platform, want, controlPlanes, quietIfReady)
	if err != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		for _, n := range nodes {
			if want[n.Name] {
				if r := joinRejections(rctx, client, n.IPs[0].String()); r.Count > 0 {
					fmt.Fprintf(out, "%s (%s): %s\n", n.Name, n.IPs[0], r)
				}
			}
		}
	}
	return err
}

// waitReady waits until every node in want joined (its Node object exists), is Ready, and
// runs a ready verification service: a node counts as ready when it can be verified. A control
// plane (in controlPlanes) also needs its removed-node authorizer ready, when it reports one:
// a control plane whose report says not synced, or whose report is stale, is waited for (the
// authorizer fails open, so a control plane without it is not whole); one without any report
// is not, since images from before the reports never write one (status shows it as degraded).
// Each step is a phase line, except for nodes that are ready at the first look when
// quietIfReady (an apply that adds one node does not announce the others). While it waits,
// prog says per node what is missing (with what the platform reports of the node, when
// platform is set) and the last error of the API server.
func waitReady(ctx context.Context, t *phaseTimer, prog *progress, client kubernetes.Interface, platform provider.Provider, want, controlPlanes map[string]bool, quietIfReady bool) error {
	joined, ready := map[string]bool{}, map[string]bool{}
	// The first look that reached the API server decides what is quiet: a look that failed
	// (an API server restarting) saw nothing.
	looked, waited := false, false
	for n := range want {
		prog.waiting(n, "to register with Kubernetes")
	}
	for {
		reported := map[string]string{}
		if platform != nil {
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			if nodes, err := platform.Nodes(pctx); err == nil {
				for _, n := range nodes {
					reported[n.Name] = fmt.Sprintf("platform: %s", n.State)
					if n.Reported != "" {
						reported[n.Name] += ", bootstrapper: " + n.Reported
					}
				}
			}
			cancel()
		}
		err := readyRound(ctx, t, prog, client, want, controlPlanes, joined, ready, reported, !looked && quietIfReady)
		if err != nil {
			for n := range want {
				if !ready[n] {
					prog.failed(n, fmt.Errorf("the Kubernetes API: %w", err))
				}
			}
		}
		var missing []string
		for n := range want {
			if !ready[n] {
				missing = append(missing, n)
			}
		}
		if !looked && err == nil {
			waited = len(missing) > 0
			looked = true
		}
		if len(missing) == 0 {
			if !quietIfReady || waited {
				t.phase("all ready", fmt.Sprintf("%d nodes", len(ready)))
			}
			return nil
		}
		select {
		case <-ctx.Done():
			slices.Sort(missing)
			return fmt.Errorf("nodes not ready (Ready with a running verification service): %s: %w", prog.summary(), ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

// readyRound is one look of waitReady.
func readyRound(ctx context.Context, t *phaseTimer, prog *progress, client kubernetes.Interface, want, controlPlanes, joined, ready map[string]bool, reported map[string]string, quiet bool) error {
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	nodes, err := client.CoreV1().Nodes().List(lctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	gate, err := newAuthorizerGate(lctx, client, want, controlPlanes, ready)
	if err != nil {
		return err
	}
	verifiable, err := verifiableNodes(lctx, client)
	if err != nil {
		return err
	}
	registered := map[string]bool{}
	for _, n := range nodes.Items {
		if !want[n.Name] {
			continue
		}
		registered[n.Name] = true
		if quiet && isReady(n) && verifiable[n.Name] && gate.why(n.Name) == "" {
			joined[n.Name], ready[n.Name] = true, true
			prog.done(n.Name)
			continue
		}
		if !joined[n.Name] {
			// Workers often join while init still waits for the services: say
			// when the node registered, not only when we saw it.
			joined[n.Name] = true
			at := n.CreationTimestamp.Sub(t.start)
			when := fmt.Sprintf("at %.1fs", at.Seconds())
			if at < 0 {
				when = "before this command started"
			}
			t.phase("join", fmt.Sprintf("%s (Node registered %s)", n.Name, when))
		}
		switch why := gate.why(n.Name); {
		case ready[n.Name]:
		case isReady(n) && verifiable[n.Name] && why == "":
			ready[n.Name] = true
			prog.done(n.Name)
			t.phase("ready", n.Name+" ("+gate.readyWhat(n.Name)+")")
		case isReady(n) && verifiable[n.Name]:
			prog.waiting(n.Name, "its removed-node authorizer to be ready (now: "+why+")")
		case !isReady(n):
			what := "its kubelet to report Ready"
			if c := readyCondition(n); c != nil && c.Reason != "" {
				what += " (now: " + untrusted.Text(c.Reason) + ")"
			}
			prog.waiting(n.Name, what)
		default:
			prog.waiting(n.Name, "its verification service to run")
		}
	}
	for n := range want {
		if !registered[n] {
			what := "to register with Kubernetes"
			if r := reported[n]; r != "" {
				what += " (" + r + ")"
			}
			prog.waiting(n, what)
		}
	}
	return nil
}

// authorizerGate holds back a control plane whose removed-node authorizer reports that it is
// not ready (docs/node-lifecycle.md "The removed-node authorizer's readiness"). A control plane
// without a report (an image from before the reports) is not held back.
type authorizerGate struct {
	controlPlanes map[string]bool
	reports       map[string]nodeauthz.Report
	now           time.Time
}

// newAuthorizerGate reads the authorizers' reports, only when a control plane is still awaited.
func newAuthorizerGate(ctx context.Context, client kubernetes.Interface, want, controlPlanes, ready map[string]bool) (authorizerGate, error) {
	g := authorizerGate{controlPlanes: controlPlanes, now: time.Now()}
	for n := range want {
		if controlPlanes[n] && !ready[n] {
			reports, err := nodeauthz.Reports(ctx, client)
			g.reports = reports
			return g, err
		}
	}
	return g, nil
}

// why is why control plane n's authorizer holds it back, "" when it does not.
func (g authorizerGate) why(n string) string {
	if !g.controlPlanes[n] {
		return ""
	}
	if h := nodeauthz.Assess(g.reports, n, g.now); h.Reported && !h.Ready {
		return h.Why
	}
	return ""
}

// readyWhat says what node n's readiness consists of, for the ready phase line.
func (g authorizerGate) readyWhat(n string) string {
	switch h := nodeauthz.Assess(g.reports, n, g.now); {
	case !g.controlPlanes[n]:
		return "Ready, verification service up"
	case h.Ready:
		return "Ready, verification service up, removed-node authorizer synced"
	default:
		return "Ready, verification service up; its removed-node authorizer: " + h.Why
	}
}

// verifiableNodes are the nodes on which a verification service pod is ready.
func verifiableNodes(ctx context.Context, client kubernetes.Interface) (map[string]bool, error) {
	verifiers, err := client.CoreV1().Pods(clusterrecord.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + deploy.VerificationService})
	if err != nil {
		return nil, err
	}
	verifiable := map[string]bool{}
	for _, p := range verifiers.Items {
		if podReady(p) {
			verifiable[p.Spec.NodeName] = true
		}
	}
	return verifiable, nil
}

// toolPath names a command for the user to run: its bare name when it is on PATH outside
// the build output (make puts _output/bin on PATH; the user's shell does not), else the
// build output's path (the CLI in _output/bin, kubectl in _output/kube/<default version>/bin:
// kubectl works with API servers one minor version apart, so with every supported version).
func toolPath(name string) string {
	exe, err := os.Executable()
	if err != nil {
		return name
	}
	output := filepath.Dir(filepath.Dir(exe)) + string(filepath.Separator)
	if found, err := exec.LookPath(name); err == nil {
		if abs, err := filepath.Abs(found); err == nil && !strings.HasPrefix(abs, output) {
			return name
		}
	}
	candidates := []string{filepath.Join(filepath.Dir(exe), name), filepath.Join(output, "kube", config.DefaultKubernetesVersion, "bin", name)}
	if name == "constellation" {
		candidates = []string{exe}
	}
	for _, c := range candidates {
		if info, err := os.Stat(c); err == nil && !info.IsDir() {
			return c
		}
	}
	return name
}

// kubectlFor names the kubectl of the cluster's Kubernetes version: the build output's
// (_output/kube/<version>/bin/kubectl) when there is one, as make builds it, so that the
// kubectl the user is told to run is the cluster's own version; else toolPath's choice.
func kubectlFor(version string) string {
	if exe, err := os.Executable(); err == nil {
		own := filepath.Join(filepath.Dir(filepath.Dir(exe)), "kube", version, "bin", "kubectl")
		if info, err := os.Stat(own); err == nil && !info.IsDir() {
			return own
		}
	}
	return toolPath("kubectl")
}

func newKubeClient(kubeconfig string) (kubernetes.Interface, error) {
	cfg, err := newKubeConfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

func newKubeConfig(kubeconfig string) (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("reading the admin kubeconfig: %w", err)
	}
	cfg.Timeout = 10 * time.Second
	return cfg, nil
}

// rejectionWait bounds the wait for the join service's refusal of a node that is not
// expected to join: longer than the join client's longest back-off (30 s) plus a handshake.
const rejectionWait = 45 * time.Second

// waitRejected polls the join services' published refusals until they record a refusal of ip, or
// wait has passed, or ctx ends; it returns what they recorded by then.
func waitRejected(ctx context.Context, client kubernetes.Interface, ip string, wait time.Duration) rejections {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for {
		r := joinRejections(ctx, client, ip)
		if r.Count > 0 {
			return r
		}
		select {
		case <-ctx.Done():
			return r
		case <-time.After(time.Second):
		}
	}
}

// joinRejections reads what the join services refused of ip: the refusals they publish in
// the cluster (internal/joinservice/refusals, docs/joinservice.md), read with the admin
// credentials.
func joinRejections(ctx context.Context, client kubernetes.Interface, ip string) rejections {
	return rejections{refusals.Of(ctx, client, ip)}
}

func podReady(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func isReady(n corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
