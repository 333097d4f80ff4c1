package cli

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/openconstellation/constellation/api/recover/recoverpb"
	"github.com/openconstellation/constellation/internal/attestation/akca"
	"github.com/openconstellation/constellation/internal/bootstrapper/bootstraptest"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/recovery"
	"github.com/openconstellation/constellation/internal/state"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

const (
	diskOfWorker = "0d9e4a2c-5b1f-4c3e-8a7d-6f2e1b0c9a88"
	diskOfCP1    = "c0ffee00-0000-4000-8000-000000000001"
	someDisk     = "3f2504e0-4f89-11d3-9a0c-0305e82c3301"
)

// recoveryState is an initialized cluster of control planes cps (name → recorded disk, ""
// for none) and worker-0, whose disk is diskOfWorker.
func recoveryState(keys bootstraptest.ClusterKeys, cps ...[2]string) *state.State {
	now := time.Now().UTC()
	st := &state.State{
		Version: state.Version1, Name: "demo", Provider: state.ProviderLocal, Phase: state.Initialized,
		CreatedAt: now, InitializedAt: now, InitEndpoint: "10.42.0.10:9000",
		ClusterID: keys.ClusterID, MeasurementSalt: keys.MeasurementSalt,
	}
	for i, cp := range cps {
		st.Nodes = append(st.Nodes, state.Node{Name: cp[0], Role: metadata.ControlPlane, IPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 42, 0, byte(10 + i)})}, Disk: cp[1]})
	}
	st.Nodes = append(st.Nodes, state.Node{Name: "worker-0", Role: metadata.Worker, IPs: []netip.Addr{netip.MustParseAddr("10.42.0.50")}, Disk: diskOfWorker})
	return st
}

// recover refuses, through the command and before it reads anything else (configuration,
// master secret) or dials anyone, a control plane with no recorded disk and every --disk
// that would hand a node a disk that is not its own.
func TestRecoverRefusesWithoutItsDisk(t *testing.T) {
	keys := bootstraptest.NewClusterKeys(t)
	testCases := map[string]struct {
		args    []string
		cp0Disk string // control-plane-0's recorded disk (default none)
		want    []string
		passes  bool // the disk check passes: the command stops at the missing configuration
		wantOut string
	}{
		"control plane without recorded disk": {
			want: []string{"recover refuses, nothing was sent", "no disk is recorded for control plane control-plane-0", "--disk control-plane-0=UUID", filepath.Join("mini", "nodes", "control-plane-0", "state", "uuid")},
		},
		"--disk naming a worker's disk": {
			args: []string{"--disk", "control-plane-0=" + diskOfWorker},
			want: []string{"records disk " + diskOfWorker + " as worker-0's: recover never sends one node another node's disk key", "no disk is recorded for control plane control-plane-0"},
		},
		"--disk naming another control plane's disk": {
			args: []string{"--disk", "control-plane-0=" + diskOfCP1},
			want: []string{"records disk " + diskOfCP1 + " as control-plane-1's"},
		},
		"--disk for a worker": {
			args: []string{"--disk", "worker-0=" + someDisk},
			want: []string{"worker-0 is a worker; only control planes are recovered", "no disk is recorded for control plane control-plane-0"},
		},
		"--disk for an unknown node": {
			args: []string{"--disk", "control-plane-9=" + someDisk},
			want: []string{`no node "control-plane-9"`},
		},
		"--disk not a UUID": {
			args: []string{"--disk", "control-plane-0=../../etc/passwd"},
			want: []string{"disk UUID is not of the form"},
		},
		"--disk twice": {
			args: []string{"--disk", "control-plane-0=" + someDisk, "--disk", "control-plane-0=c0ffee00-0000-4000-8000-000000000009"},
			want: []string{"a second disk for control-plane-0"},
		},
		"--disk without a node": {
			args: []string{"--disk", someDisk},
			want: []string{"want NODE=UUID"},
		},
		"--disk naming the node's disk (upper case is the same UUID)": {
			args:   []string{"--disk", "control-plane-0=" + strings.ToUpper(someDisk)},
			passes: true,
		},
		"--disk replacing a recorded disk": {
			args:    []string{"--disk", "control-plane-1=" + someDisk},
			cp0Disk: "c0ffee00-0000-4000-8000-000000000000",
			passes:  true,
			wantOut: "control-plane-1: using disk " + someDisk + " (--disk) instead of the recorded " + diskOfCP1,
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			ws := t.TempDir()
			st := recoveryState(keys, [2]string{"control-plane-0", tc.cp0Disk}, [2]string{"control-plane-1", diskOfCP1})
			path := filepath.Join(ws, state.FileName)
			require.NoError(t, state.Write(path, st))
			before, err := os.ReadFile(path)
			require.NoError(t, err)

			out, err := run(t, append([]string{"recover", "-C", ws}, tc.args...)...)
			require.Error(t, err)
			if tc.passes {
				assert.ErrorContains(t, err, "constellation-conf.yaml", "past the disk check, at the next step")
				assert.NotContains(t, err.Error(), "refuses")
			} else {
				assert.NotContains(t, err.Error(), "constellation-conf.yaml", "refused before the configuration is read")
			}
			for _, want := range tc.want {
				assert.ErrorContains(t, err, want)
			}
			assert.Contains(t, out, tc.wantOut)
			after, err := os.ReadFile(path)
			require.NoError(t, err)
			assert.Equal(t, before, after, "the state file is unchanged")
		})
	}
}

// recoveringPlatform is a platform whose nodes wait for recovery, with their recovery servers
// at test addresses.
type recoveringPlatform struct {
	provider.Provider
	nodes []provider.Node
	addrs map[string]string // node IP:port → test server
}

func (p recoveringPlatform) Nodes(context.Context) ([]provider.Node, error) { return p.nodes, nil }

func (p recoveringPlatform) Dialer() func(context.Context, string) (net.Conn, error) {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		to, ok := p.addrs[addr]
		if !ok {
			return nil, fmt.Errorf("no node at %s", addr)
		}
		var d net.Dialer
		return d.DialContext(ctx, "tcp", to)
	}
}

// The command's recovery loop with the real recovery servers of genuine nodes: control-plane-0
// gets its own disk's key; control-plane-1, a genuine control plane certified for its name,
// holds a copy of control-plane-0's disk and names it: refused before any key is derived, and
// the error says whose disk it is.
func TestRecoverSendsEachNodeOnlyItsRecordedDisk(t *testing.T) {
	if testing.Short() {
		t.Skip("runs swtpm and gocryptfs")
	}
	ca, err := akca.New("local AK CA", time.Now(), time.Hour)
	require.NoError(t, err)
	keys := bootstraptest.NewClusterKeys(t)
	victim := bootstraptest.NewNode(t, "control-plane-0", metadata.ControlPlane, ca)
	keys.CommitAndReboot(t, victim)
	attacker := bootstraptest.NewNode(t, "control-plane-1", metadata.ControlPlane, ca)
	keys.CommitAndReboot(t, attacker)
	// Recorded while the cluster ran.
	st := recoveryState(keys, [2]string{"control-plane-0", victim.DiskUUID(t)}, [2]string{"control-plane-1", attacker.DiskUUID(t)})
	attacker.HoldDiskOf(t, victim)

	platform := recoveringPlatform{addrs: map[string]string{}}
	servers := map[string]*bootstraptest.RecoveryServer{}
	for i, n := range []*bootstraptest.Node{victim, attacker} {
		srv := bootstraptest.StartRecoveryServer(t, n, bootstraptest.RecoveryServerOptions{})
		servers[n.Name] = srv
		platform.addrs[nodeEndpoint(st.Nodes[i], provider.RecoverPort)] = srv.Addr
		platform.nodes = append(platform.nodes, provider.Node{
			NodeSpec: provider.NodeSpec{Name: n.Name, Role: metadata.ControlPlane}, State: provider.Running, Reported: metadata.PhaseWaitingForRecovery,
		})
	}
	disks, _, err := recoveryDisks(st, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	rec := controlPlaneRecovery{platform: platform, validator: bootstraptest.Validator(t, ca), master: keys.Master, st: st, disks: disks}
	t0 := newPhaseTimer(&out)
	_, err = rec.run(ctx, t0, newProgress(t0))

	require.ErrorIs(t, err, recovery.ErrWrongDisk)
	assert.ErrorContains(t, err, "recovering control-plane-1")
	assert.ErrorContains(t, err, fmt.Sprintf(`node "control-plane-1" names disk %s, but its recorded disk is %s`, victim.DiskUUID(t), st.Nodes[1].Disk))
	assert.ErrorContains(t, err, state.FileName+" records "+victim.DiskUUID(t)+" as control-plane-0's disk")
	assert.Equal(t, []string{recoverpb.RecoverService_Hello_FullMethodName}, servers["control-plane-1"].Calls.Methods(), "asked for its disk, sent no key")
	assert.Equal(t, make([]byte, 32), attacker.ClusterIDRegister(t))
	assert.False(t, attacker.Unlocked(t))

	// The genuine control plane, recovered first (state order), got its own disk's key.
	assert.Contains(t, out.String(), "control-plane-0 got its keys over attested TLS")
	assert.Equal(t, variant.QEMUVTPM.ClusterIDMarker(keys.ClusterID), victim.ClusterIDRegister(t))
	assert.True(t, victim.Unlocked(t))
}

// A disk named with --disk is used for that node only, and recorded once the node recovered
// with it.
func TestRecoverWithDiskOverride(t *testing.T) {
	if testing.Short() {
		t.Skip("runs swtpm and gocryptfs")
	}
	ca, err := akca.New("local AK CA", time.Now(), time.Hour)
	require.NoError(t, err)
	keys := bootstraptest.NewClusterKeys(t)
	n := bootstraptest.NewNode(t, "control-plane-0", metadata.ControlPlane, ca)
	keys.CommitAndReboot(t, n)
	srv := bootstraptest.StartRecoveryServer(t, n, bootstraptest.RecoveryServerOptions{})
	ws := t.TempDir()
	st := recoveryState(keys, [2]string{"control-plane-0", ""})
	require.NoError(t, state.Write(filepath.Join(ws, state.FileName), st))
	platform := recoveringPlatform{
		addrs: map[string]string{nodeEndpoint(st.Nodes[0], provider.RecoverPort): srv.Addr},
		nodes: []provider.Node{{NodeSpec: provider.NodeSpec{Name: n.Name, Role: metadata.ControlPlane}, State: provider.Running, Reported: metadata.PhaseWaitingForRecovery}},
	}
	_, _, err = recoveryDisks(st, nil)
	require.ErrorContains(t, err, "no disk is recorded for control plane control-plane-0")

	disks, _, err := recoveryDisks(st, []string{"control-plane-0=" + n.DiskUUID(t)})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	rec := controlPlaneRecovery{platform: platform, validator: bootstraptest.Validator(t, ca), master: keys.Master, st: st, disks: disks}
	t0 := newPhaseTimer(&out)
	recovered, err := rec.run(ctx, t0, newProgress(t0))
	require.NoError(t, err)
	assert.True(t, n.Unlocked(t))
	require.NoError(t, recordRecoveredDisks(&out, ws, st, recovered, disks))
	assert.Contains(t, out.String(), "control-plane-0: disk "+n.DiskUUID(t)+" recorded in "+state.FileName+" (--disk)")
	loaded, err := state.Load(filepath.Join(ws, state.FileName))
	require.NoError(t, err)
	assert.Equal(t, n.DiskUUID(t), loaded.Nodes[0].Disk)
}

// A control plane that reports its state disk refused (its header replaced while it was off)
// gets no key. Refused for longer than the node takes to look again, it ends recover, naming
// the node's reason; a refusal that clears within that (the operator restored the disk right
// before) is waited out, and the node recovers.
func TestRecoverOnARefusedStateDisk(t *testing.T) {
	const why = "state storage on /dev/vdb: LUKS2 header refused: segment 0 has no integrity protection, want hmac(sha256)"
	for name, tc := range map[string]struct {
		clearsAfter time.Duration // 0: never
		wantErr     bool
	}{
		"kept refused":           {wantErr: true},
		"restored while waiting": {clearsAfter: metadata.StateDiskRecheck},
	} {
		t.Run(name, func(t *testing.T) {
			keys := bootstraptest.NewClusterKeys(t)
			st := recoveryState(keys, [2]string{"control-plane-0", someDisk})
			fake := testingclock.NewFakeClock(time.Now())
			start := fake.Now()
			platform := &reportingPlatform{report: func() provider.Node {
				n := provider.Node{NodeSpec: provider.NodeSpec{Name: "control-plane-0", Role: metadata.ControlPlane}, State: provider.Running,
					Reported: metadata.PhaseStateDiskRefused, ReportedDetail: why}
				if tc.clearsAfter > 0 && fake.Since(start) >= tc.clearsAfter {
					n.Reported, n.ReportedDetail = metadata.PhaseWaitingForRecovery, ""
				}
				return n
			}}
			var sent atomic.Int32
			rec := controlPlaneRecovery{platform: platform, master: keys.Master, st: st, disks: map[string]string{"control-plane-0": someDisk}, clock: fake,
				recover: func(_ context.Context, cfg recovery.Config) ([]byte, error) {
					assert.GreaterOrEqual(t, fake.Since(start), tc.clearsAfter, "a key sent while the node refused its disk")
					sent.Add(1)
					return nil, nil
				}}
			out := &lockedBuffer{}
			t0 := newPhaseTimer(out)
			done := make(chan error, 1)
			go func() { _, err := rec.run(context.Background(), t0, newProgress(t0)); done <- err }()
			var err error
			require.Eventually(t, func() bool {
				select {
				case err = <-done:
					return true
				default:
				}
				if fake.HasWaiters() {
					fake.Step(time.Second)
				}
				return false
			}, 30*time.Second, time.Millisecond)
			if !tc.wantErr {
				require.NoError(t, err)
				assert.EqualValues(t, 1, sent.Load())
				return
			}
			require.Error(t, err)
			assert.ErrorContains(t, err, "control-plane-0 refuses its state disk")
			assert.ErrorContains(t, err, why)
			assert.GreaterOrEqual(t, fake.Since(start), refusalGrace, "ended before the node looked again")
			assert.Zero(t, sent.Load())
		})
	}
}

// reportingPlatform is a platform whose one node reports what report says at each look.
type reportingPlatform struct {
	provider.Provider
	report func() provider.Node
}

func (p *reportingPlatform) Nodes(context.Context) ([]provider.Node, error) {
	return []provider.Node{p.report()}, nil
}

func (p *reportingPlatform) Dialer() func(context.Context, string) (net.Conn, error) { return nil }
