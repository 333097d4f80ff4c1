package cli

import (
	"bytes"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/provider"
)

func TestPrintStatus(t *testing.T) {
	at := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	r := &statusReport{
		Cluster: clusterStatus{Name: "demo", Provider: "local", Phase: "initialized", ClusterID: "abcd"},
		Nodes: []nodeStatus{
			{
				Name: "control-plane-0", Role: "control-plane", IP: "10.42.0.10",
				Provider:    &providerView{State: provider.Running, Reported: "waiting-for-recovery", Boots: 2},
				Kubernetes:  &kubernetesView{Registered: true, Ready: false, Reason: "NodeStatusUnknown"},
				Attestation: &attestationStatus{Error: "verify 10.42.0.10:30081: connection refused\nmore"},
			},
			{
				Name: "worker-0", Role: "worker", IP: "10.42.0.11",
				Provider: &providerView{State: provider.Running, Reported: "rejoined", Boots: 2, Events: []provider.Event{
					{Time: at, Message: "booted (created)"},
					{Time: at, Message: "bootstrapper exited (signal: killed) after 1m: rebooting"},
				}},
				Kubernetes:  &kubernetesView{Registered: true, Ready: true, Version: "v1.34.4"},
				Attestation: &attestationStatus{Verified: true, ReferenceSet: "local-1"},
			},
			{Name: "worker-1", Role: "worker", IP: "10.42.0.12"},
			{
				Name: "worker-3", Role: "worker", IP: "10.42.0.14",
				Provider: &providerView{State: provider.Running, Reported: "tpm-cannot-quote", Boots: 1,
					ReportedDetail: "the TPM is in dictionary-attack lockout ...; it clears after at most 16m40s of uninterrupted uptime, by 2026-11-24T10:16:40Z"},
			},
		},
		Removed:  []removedStatus{{Name: "worker-2", Role: "worker", RemovedAt: at, Admission: "refused: removed from the cluster"}},
		Services: []serviceStatus{{Name: "constellation-join-service", Desired: 1, Ready: 0}},
		Errors:   []string{"kubernetes: listing nodes: timeout"},
	}
	var out bytes.Buffer
	printStatus(&out, r)
	for _, want := range []string{
		"Cluster demo (local provider, initialized, ID abcd)",
		"running (waiting-for-recovery)",
		"NotReady NodeStatusUnknown",
		"FAILED: verify 10.42.0.10:30081: connection refused",
		`verified (set "local-1")`,
		"worker-0: bootstrapper exited (signal: killed) after 1m: rebooting",
		"worker-1         worker         10.42.0.12  unknown",
		"running (tpm-cannot-quote)",
		"  worker-3: tpm-cannot-quote: the TPM is in dictionary-attack lockout ...; it clears after at most 16m40s of uninterrupted uptime, by 2026-11-24T10:16:40Z",
		"Services: join-service 0/1 ready",
		"Removed: worker-2 (worker,",
		"note: kubernetes: listing nodes: timeout",
	} {
		assert.Contains(t, out.String(), want)
	}
	assert.NotContains(t, out.String(), "more", "only the first line of an error")
}

// The day-two commands on a workspace without a cluster say so, and touch nothing.
func TestDayTwoCommandsWithoutCluster(t *testing.T) {
	for _, args := range [][]string{{"status"}, {"reboot", "worker-0"}, {"stop"}, {"start"}, {"recover"}} {
		ws := t.TempDir()
		out, err := run(t, append(args, "-C", ws)...)
		require.Error(t, err, "%v", args)
		assert.Contains(t, out, "no cluster was created in this workspace", "%v", args)
		left, err := os.ReadDir(ws)
		require.NoError(t, err)
		assert.Empty(t, left, "%v", args)
	}
}
