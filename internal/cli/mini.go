package cli

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/openconstellation/constellation/internal/attestation/akca"
	"github.com/openconstellation/constellation/internal/attestation/measurements"
	"github.com/openconstellation/constellation/internal/provider/local"
	"github.com/openconstellation/constellation/internal/swtpm"
)

func newMiniCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "mini",
		Short: "Run a local confidential cluster on this machine",
	}
	cmd.AddCommand(newMiniUpCmd(), newMiniDownCmd(), newMiniNodeCmd())
	return cmd
}

func newMiniUpCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "up",
		Short: "Create a local cluster (preview: attested handshake between local nodes)",
		Long: `Create a local cluster.

Preview: the Kubernetes part of the local cluster is not implemented yet. mini up runs the
largest real flow that works today: it creates three nodes, each with its own software TPM
(swtpm), measures the node image into their PCRs, certifies their attestation keys, computes
the reference values offline, and has the nodes connect over the attested channel (mutual
aTLS). node-1 runs the genuine image and is admitted; node-2 runs a modified binary and is
rejected with the mismatching PCR named.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ws, _ := cmd.Flags().GetString("workspace")
			ctx, cancel := context.WithTimeout(cmd.Context(), 3*time.Minute)
			defer cancel()
			return miniUp(ctx, cmd.OutOrStdout(), ws)
		},
	}
}

func newMiniDownCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "down",
		Short: "Remove the local cluster and everything mini up created",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ws, _ := cmd.Flags().GetString("workspace")
			return miniDown(cmd.OutOrStdout(), ws)
		},
	}
}

// miniDir is the folder below the workspace that mini up owns entirely.
const miniDir = "mini"

func miniUp(ctx context.Context, out io.Writer, workspace string) (retErr error) {
	dir := filepath.Join(workspace, miniDir)
	if _, err := os.Stat(dir); err == nil {
		return fmt.Errorf("%s exists: a local cluster is already up; run 'constellation mini down' first", dir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "Constellation mini up (preview)")
	fmt.Fprintln(out, "The Kubernetes cluster is not implemented yet; running the largest real flow that works today:")
	fmt.Fprintln(out, "a mutual attested TLS handshake between local nodes, each with its own swtpm vTPM.")
	fmt.Fprintln(out)

	// The node image: what the provider measures, and what reference values are computed from.
	nodeConfig := []byte(`{"image":"constellation-local-preview","kubernetes":"v1.34.4"}`)
	bootstrapper, err := local.FileComponent("bootstrapper", local.PCRBootstrapper, self)
	if err != nil {
		return err
	}
	image := []local.Component{bootstrapper, local.BytesComponent("node-config", local.PCRNodeConfig, nodeConfig)}
	sets := measurements.ReferenceSets{{Name: "local-image", Measurements: local.ExpectedPCRs(image)}}
	refPath := filepath.Join(dir, "reference-values.json")
	if err := writeJSON(refPath, sets); err != nil {
		return err
	}
	fmt.Fprintf(out, "Reference values computed offline from the node image (%s):\n", refPath)
	for _, c := range image {
		fmt.Fprintf(out, "  PCR %-2d %x  (%s)\n", c.PCR, sets[0].Measurements[uint32(c.PCR)].Expected, c.Name)
	}

	ca, err := akca.New("constellation mini AK CA", time.Now(), 30*24*time.Hour)
	if err != nil {
		return err
	}
	caCert, caKey, err := ca.PEM()
	if err != nil {
		return err
	}
	caPath := filepath.Join(dir, "ak-ca.pem")
	if err := os.WriteFile(caPath, caCert, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "ak-ca-key.pem"), caKey, 0o600); err != nil {
		return err
	}

	// A tampered image: same config, different bootstrapper binary.
	tampered := append([]local.Component{{Name: "bootstrapper (modified)", PCR: local.PCRBootstrapper, Digest: sha256.Sum256(append(bootstrapper.Digest[:], "backdoor"...))}}, image[1:]...)
	nodes := []struct {
		name  string
		image []local.Component
	}{{"node-0", image}, {"node-1", image}, {"node-2", tampered}}

	var tpms []*swtpm.Process
	defer func() {
		for _, p := range tpms {
			_ = p.Stop()
		}
		_ = os.Remove(filepath.Join(dir, "pids"))
	}()
	fmt.Fprintln(out)
	for _, n := range nodes {
		proc, err := swtpm.Start(ctx, swtpm.Options{StateDir: filepath.Join(dir, n.name, "tpm")})
		if err != nil {
			return fmt.Errorf("%s: %w", n.name, err)
		}
		tpms = append(tpms, proc)
		if err := recordPid(dir, proc.Pid()); err != nil {
			return err
		}
		tpm, err := proc.Open(ctx)
		if err != nil {
			return fmt.Errorf("%s: %w", n.name, err)
		}
		err = local.Measure(tpm, n.image)
		if err == nil {
			err = local.CertifyAK(tpm, ca, n.name, time.Now())
		}
		tpm.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", n.name, err)
		}
		fmt.Fprintf(out, "%s: swtpm pid %d, image measured (%s), AK certified by the workspace CA\n", n.name, proc.Pid(), componentNames(n.image))
	}

	nodeArgs := func(i int) []string {
		return []string{"mini", "node", "--name", nodes[i].name, "--tpm", tpms[i].Addr(), "--reference-values", refPath, "--ak-roots", caPath}
	}
	server, serverEvents, err := startNode(ctx, dir, self, append(nodeArgs(0), "--listen", "127.0.0.1:0", "--accept", "2"))
	if err != nil {
		return err
	}
	defer func() { _ = server.Process.Kill(); _ = server.Wait() }()
	first, ok := <-serverEvents
	if !ok || first.Event != "listening" {
		return errors.New("node-0 did not start listening (see mini/node-0.log)")
	}
	fmt.Fprintf(out, "node-0: serving attested connections on %s\n\n", first.Addr)

	failures := 0
	for i := 1; i <= 2; i++ {
		client, clientEvents, err := startNode(ctx, dir, self, append(nodeArgs(i), "--dial", first.Addr))
		if err != nil {
			return err
		}
		clientEv := <-clientEvents
		_ = client.Wait()
		serverEv := <-serverEvents
		wantAdmitted := i == 1
		fmt.Fprintf(out, "%s -> node-0, mutual attested TLS:\n", nodes[i].name)
		printEvent(out, "node-0 about "+nodes[i].name, serverEv)
		printEvent(out, nodes[i].name+" about node-0", clientEv)
		admitted := serverEv.Event == "verified" && clientEv.Event == "verified"
		if admitted != wantAdmitted {
			failures++
			fmt.Fprintf(out, "  UNEXPECTED: %s should have been %s\n", nodes[i].name, map[bool]string{true: "admitted", false: "rejected"}[wantAdmitted])
		}
		fmt.Fprintln(out)
	}
	if failures > 0 {
		return fmt.Errorf("%d unexpected handshake result(s)", failures)
	}
	fmt.Fprintln(out, "Result: the genuine node was admitted by attestation, the modified node was rejected.")
	fmt.Fprintf(out, "Files are in %s; remove them with 'make down' (constellation mini down).\n", dir)
	return nil
}

func startNode(ctx context.Context, dir, self string, args []string) (*exec.Cmd, <-chan nodeEvent, error) {
	name := args[3]
	logFile, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.CommandContext(ctx, self, args...)
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	if err := recordPid(dir, cmd.Process.Pid); err != nil {
		return nil, nil, err
	}
	events := make(chan nodeEvent, 4)
	go func() {
		defer close(events)
		defer logFile.Close()
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			fmt.Fprintln(logFile, sc.Text())
			var ev nodeEvent
			if json.Unmarshal(sc.Bytes(), &ev) == nil {
				events <- ev
			}
		}
	}()
	return cmd, events, nil
}

func printEvent(out io.Writer, who string, ev nodeEvent) {
	switch ev.Event {
	case "verified":
		cert := "uncertified AK"
		if ev.Certified {
			cert = "AK certified"
		}
		fmt.Fprintf(out, "  %s: VERIFIED (variant qemu-vtpm, reference set %q, %s, AK %s…)\n", who, ev.Set, cert, ev.Signer[:16])
		var idx []int
		for k := range ev.Registers {
			i, _ := strconv.Atoi(k)
			idx = append(idx, i)
		}
		sort.Ints(idx)
		for _, i := range idx {
			if v := ev.Registers[strconv.Itoa(i)]; strings.Trim(v, "0") != "" {
				fmt.Fprintf(out, "      PCR %-2d %s\n", i, v)
			}
		}
	case "rejected":
		fmt.Fprintf(out, "  %s: REJECTED: %s\n", who, ev.Error)
	default:
		fmt.Fprintf(out, "  %s: no result (node exited; see its log)\n", who)
	}
}

func miniDown(out io.Writer, workspace string) error {
	dir := filepath.Join(workspace, miniDir)
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		fmt.Fprintln(out, "no local cluster in", workspace)
		return nil
	}
	// End only processes mini up started and recorded, and only if they still are ours.
	if data, err := os.ReadFile(filepath.Join(dir, "pids")); err == nil {
		for _, f := range strings.Fields(string(data)) {
			pid, err := strconv.Atoi(f)
			if err != nil {
				continue
			}
			cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			if err == nil && strings.Contains(string(cmdline), dir) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	fmt.Fprintln(out, "removed", dir)
	return nil
}

func recordPid(dir string, pid int) error {
	f, err := os.OpenFile(filepath.Join(dir, "pids"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = fmt.Fprintln(f, pid)
	return err
}

func componentNames(image []local.Component) string {
	var names []string
	for _, c := range image {
		names = append(names, fmt.Sprintf("%s→PCR %d", c.Name, c.PCR))
	}
	return strings.Join(names, ", ")
}

func writeJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}
