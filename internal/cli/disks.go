package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/openconstellation/constellation/internal/diskowner"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/state"
)

// Each node's disk is copied into the state file while the cluster runs, because
// `constellation recover` runs when it does not: recover sends a control plane only the key
// of the disk recorded for it (recovery.Config.Disk). The source is the cluster's disk-owner
// records (internal/diskowner), the ones the join service releases rejoin keys by: written
// after attestation, for the node name in the platform-certified AK, first writer wins,
// immutable, and complete (every node that joined has one, whichever command or reboot made
// it join). The CLI reads them with the admin's credentials over the API server's TLS, pinned
// by the kubeconfig init returned over the attested channel. Whoever could forge a record
// there (cluster-admin, a control plane) can read the master secret anyway.
//
// When: after init (the init node's disk), when apply has every node Ready (new nodes, and
// every apply that changes nothing), at every status, before reboot and stop, and after
// recover. So a power cut, where nobody ran stop, still finds the disks of every node that
// was ever seen Ready by apply or status.

// diskRefreshTimeout bounds reading the records.
const diskRefreshTimeout = 15 * time.Second

// refreshDisks copies the cluster's disk-owner records into st (state.RecordDisks: a
// recorded disk is never silently replaced) and writes the state file if it changed, unless
// another command wrote the file since st was read: status now writes the state file too,
// and must not undo, say, an apply's new nodes with its older copy.
func refreshDisks(ctx context.Context, workspace string, st *state.State, client kubernetes.Interface) (state.DiskReport, error) {
	ctx, cancel := context.WithTimeout(ctx, diskRefreshTimeout)
	defer cancel()
	records, invalid, err := diskowner.Store{Client: client}.Records(ctx)
	if err != nil {
		return state.DiskReport{}, err
	}
	path := filepath.Join(workspace, state.FileName)
	before, err := st.Marshal()
	if err != nil {
		return state.DiskReport{}, err
	}
	owners := make([]state.DiskOwner, 0, len(records))
	for _, r := range records {
		owners = append(owners, state.DiskOwner{Disk: r.Disk, Node: r.Node})
	}
	report := st.RecordDisks(owners)
	for _, err := range invalid {
		report.Problems = append(report.Problems, err.Error()+": ignored (it gives nobody a key)")
	}
	if !report.Changed() {
		return report, nil
	}
	// Compared as this CLI writes it, so that a file written another way still counts as
	// unchanged. Another command can still write between this read and the rename below;
	// the window is the write's, not the command's.
	onDisk, err := state.Load(path)
	if err != nil {
		return report, err
	}
	current, err := onDisk.Marshal()
	if err != nil {
		return report, err
	}
	if !bytes.Equal(current, before) {
		return report, fmt.Errorf("%s changed while this command ran (another command wrote it): the disk records were not written; the next apply or status records them", state.FileName)
	}
	return report, state.Write(path, st)
}

// printDiskReport prints what refreshDisks changed and what it refused to.
func printDiskReport(out io.Writer, r state.DiskReport) {
	if len(r.Recorded) > 0 {
		fmt.Fprintf(out, "disks recorded in %s (recover sends a node only its own disk's key): %s\n", state.FileName, strings.Join(r.Recorded, "; "))
	}
	for _, s := range r.Replaced {
		fmt.Fprintf(out, "WARNING: disk record replaced: %s\n", s)
	}
	for _, s := range r.Problems {
		fmt.Fprintf(out, "WARNING: disk records: %s\n", s)
	}
}

// refreshDisksBeforeShutdown is refreshDisks for commands that take nodes down (stop,
// reboot): the last chance to record disks before recover needs them. It does not stop the
// command: a cluster that is being shut down may be unhealthy. It says which control planes
// recover will refuse. A cluster none of whose nodes runs is not asked.
func refreshDisksBeforeShutdown(ctx context.Context, out io.Writer, workspace string, st *state.State, platform provider.Provider) {
	if st.Phase != state.Initialized {
		return
	}
	path := filepath.Join(workspace, AdminConfFile)
	var err error
	if _, serr := os.Stat(path); serr != nil {
		err = fmt.Errorf("no admin kubeconfig (%s): %w", AdminConfFile, serr)
	} else if anyRunning(ctx, platform) {
		var client kubernetes.Interface
		if client, err = newKubeClient(path); err == nil {
			var report state.DiskReport
			report, err = refreshDisks(ctx, workspace, st, client)
			printDiskReport(out, report)
		}
	}
	if err != nil {
		fmt.Fprintf(out, "WARNING: could not refresh the disk records from the cluster: %v\n", err)
	}
	if missing := controlPlanesWithoutDisk(st); len(missing) > 0 {
		fmt.Fprintf(out, "WARNING: no disk recorded for %s: recover will refuse them unless told their disks (--disk NODE=UUID)\n", strings.Join(missing, ", "))
	}
}

// anyRunning reports whether the platform says a node runs (unknown counts as running: the
// refresh then finds out).
func anyRunning(ctx context.Context, platform provider.Provider) bool {
	nodes, err := platform.Nodes(ctx)
	if err != nil {
		return true
	}
	return slices.ContainsFunc(nodes, func(n provider.Node) bool { return n.State == provider.Running })
}

func controlPlanesWithoutDisk(st *state.State) []string {
	var missing []string
	for _, n := range st.ControlPlanes() {
		if n.Disk == "" {
			missing = append(missing, n.Name)
		}
	}
	return missing
}

// recoveryDisks returns, for every control plane of st, the one disk recover may send the
// key of: the disk recorded in the state file, or the one the operator names with
// --disk NODE=UUID. It refuses, before anything is dialed, a control plane with neither, an
// override for a node that is not a control plane, and an override naming a disk the state
// records as another node's (one node never gets another node's disk key, whoever asks).
func recoveryDisks(st *state.State, overrides []string) (disks map[string]string, notes []string, err error) {
	disks = map[string]string{}
	for _, n := range st.ControlPlanes() {
		if n.Disk != "" {
			disks[n.Name] = n.Disk
		}
	}
	given := map[string]bool{}
	var problems []error
	for _, o := range overrides {
		name, uuid, ok := strings.Cut(o, "=")
		if !ok {
			problems = append(problems, fmt.Errorf("--disk %q: want NODE=UUID", o))
			continue
		}
		id, err := diskowner.CanonicalUUID(uuid)
		if err != nil {
			problems = append(problems, fmt.Errorf("--disk %q: %w", o, err))
			continue
		}
		var node *state.Node
		for i := range st.Nodes {
			if st.Nodes[i].Name == name {
				node = &st.Nodes[i]
			}
		}
		switch other, owned := st.NodeByDisk(id); {
		case node == nil:
			problems = append(problems, fmt.Errorf("--disk %q: no node %q in %s (nodes: %s)", o, name, state.FileName, nodeNames(st.Nodes)))
		case node.Role != metadata.ControlPlane:
			problems = append(problems, fmt.Errorf("--disk %q: %s is a %s; only control planes are recovered (the others rejoin by themselves)", o, name, node.Role))
		case given[name]:
			problems = append(problems, fmt.Errorf("--disk %q: a second disk for %s", o, name))
		case owned && other.Name != name:
			problems = append(problems, fmt.Errorf("--disk %q: %s records disk %s as %s's: recover never sends one node another node's disk key", o, state.FileName, id, other.Name))
		default:
			given[name] = true
			if node.Disk != "" && node.Disk != id {
				notes = append(notes, fmt.Sprintf("%s: using disk %s (--disk) instead of the recorded %s", name, id, node.Disk))
			}
			disks[name] = id
		}
	}
	for _, name := range controlPlanesWithoutDisk(st) {
		if disks[name] == "" {
			problems = append(problems, fmt.Errorf("no disk is recorded for control plane %s in %s, and recover sends a node only the key of its recorded disk "+
				"(the CLI records disks while the cluster runs: apply, status, reboot, stop; this cluster went down before %s's was recorded). "+
				"Find the UUID of the disk attached to %s on the platform (local provider: %s in the workspace), and if you trust it, run recover with --disk %s=UUID",
				name, state.FileName, name, name, filepath.Join(localPlatform().Folder(""), "nodes", name, "state", "uuid"), name))
		}
	}
	if len(problems) > 0 {
		return nil, nil, fmt.Errorf("recover refuses, nothing was sent:\n%w", errors.Join(problems...))
	}
	return disks, notes, nil
}
