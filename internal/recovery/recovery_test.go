package recovery_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/openconstellation/constellation/api/recover/recoverpb"
	"github.com/openconstellation/constellation/internal/attestation/akca"
	"github.com/openconstellation/constellation/internal/attestation/softfirmware"
	"github.com/openconstellation/constellation/internal/bootstrapper/bootstraptest"
	"github.com/openconstellation/constellation/internal/bootstrapper/recoveryserver"
	"github.com/openconstellation/constellation/internal/handshakelimit/floodtest"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider/local"
	"github.com/openconstellation/constellation/internal/recovery"
	"github.com/openconstellation/constellation/pkg/atls"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/qemu"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

func skipShort(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("runs swtpm and gocryptfs")
	}
}

func newCA(t *testing.T) *akca.CA {
	t.Helper()
	ca, err := akca.New("local AK CA", time.Now(), time.Hour)
	require.NoError(t, err)
	return ca
}

// config is the CLI's configuration for recovering node, whose recorded disk is disk.
func config(t *testing.T, ca *akca.CA, keys bootstraptest.ClusterKeys, addr, node, disk string) recovery.Config {
	return recovery.Config{
		Endpoint: addr, Validator: bootstraptest.Validator(t, ca), ExpectedNode: node, Disk: disk,
		MasterSecret: keys.Master, MeasurementSalt: keys.MeasurementSalt, ClusterID: keys.ClusterID,
	}
}

func run(cfg recovery.Config) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return recovery.Recover(ctx, cfg)
}

// The node gets exactly its disk key and the measurement secret and salt: the request has
// no field for anything else, and the master secret appears nowhere in it.
func TestRecoverSendsOnlyDerivedKeys(t *testing.T) {
	skipShort(t)
	ca := newCA(t)
	keys := bootstraptest.NewClusterKeys(t)
	n := bootstraptest.NewNode(t, "control-plane-0", metadata.ControlPlane, ca)
	keys.CommitAndReboot(t, n)
	srv := bootstraptest.StartRecoveryServer(t, n, bootstraptest.RecoveryServerOptions{})

	id, err := run(config(t, ca, keys, srv.Addr, "control-plane-0", n.DiskUUID(t)))
	require.NoError(t, err)
	assert.Equal(t, keys.ClusterID, id)
	assert.Equal(t, variant.QEMUVTPM.ClusterIDMarker(keys.ClusterID), n.ClusterIDRegister(t))
	assert.True(t, n.Unlocked(t))
	assert.Equal(t, 1, srv.Kubelet.Restarts())

	calls := srv.Calls.List()
	require.Len(t, calls, 2)
	assert.Equal(t, recoverpb.RecoverService_Hello_FullMethodName, calls[0].Method)
	assert.Equal(t, recoverpb.RecoverService_Recover_FullMethodName, calls[1].Method)
	req, ok := calls[1].Request.(*recoverpb.RecoverRequest)
	require.True(t, ok)
	assert.Equal(t, keys.DiskKey(t, n), req.StateDiskKey)
	assert.Equal(t, keys.MeasurementSecret(t), req.MeasurementSecret)
	assert.Equal(t, keys.MeasurementSalt, req.MeasurementSalt)

	fields := req.ProtoReflect().Descriptor().Fields()
	var names []string
	for i := range fields.Len() {
		names = append(names, string(fields.Get(i).Name()))
	}
	assert.Equal(t, []string{"state_disk_key", "measurement_secret", "measurement_salt"}, names, "the request can carry nothing else")
	assert.Empty(t, req.ProtoReflect().GetUnknown(), "no unknown fields")
	for _, part := range [][]byte{keys.Master.Key, keys.Master.Salt} {
		for _, field := range [][]byte{req.StateDiskKey, req.MeasurementSecret, req.MeasurementSalt} {
			assert.False(t, bytes.Contains(field, part), "a part of the master secret was sent")
		}
	}
}

// The client refuses, before it sends any key (the server sees no call at all), every node
// that is not the control plane it means, of the cluster's image, waiting for recovery.
func TestRecoverRefusesBeforeSendingKeys(t *testing.T) {
	skipShort(t)
	ca := newCA(t)
	otherImage := []softfirmware.Component{
		softfirmware.BytesComponent("bootstrapper", local.PCRBootstrapper, []byte("a bootstrapper the operator never released")),
		softfirmware.BytesComponent("node config", local.PCRNodeConfig, []byte("node config under test")),
	}
	noRoots, err := qemu.NewValidator(qemu.ValidatorConfig{
		ValidatorCommon:         attestation.ValidatorCommon{ReferenceSets: measurements.ReferenceSets{{Name: "test-image", Measurements: softfirmware.ExpectedPCRs(bootstraptest.Image)}}},
		AcceptUnauthenticatedAK: true,
	})
	require.NoError(t, err)
	imagePCRs := map[uint32][]byte{}
	for i, m := range softfirmware.ExpectedPCRs(bootstraptest.Image) {
		imagePCRs[i] = m.Expected
	}

	for name, tc := range map[string]struct {
		name       string // the node's certified name (default control-plane-0)
		nodeOpts   bootstraptest.NodeOptions
		ca         *akca.CA              // certifies the node (default ca)
		validator  attestation.Validator // the CLI's (default the image's, roots ca)
		expected   string                // the node the CLI means (default control-plane-0)
		issuer     func(t *testing.T) attestation.Issuer
		otherMark  bool
		wantErr    error
		wantReason error
	}{
		"node of another image": {
			nodeOpts: bootstraptest.NodeOptions{Image: otherImage},
			wantErr:  recovery.ErrEvidence, wantReason: attestation.ErrMeasurementPolicy,
		},
		"AK certified for another node": {
			expected: "control-plane-1",
			wantErr:  recovery.ErrWrongNode,
		},
		"AK certified by another platform's CA": {
			ca:      newCA(t),
			wantErr: recovery.ErrEvidence, wantReason: attestation.ErrUntrustedSigner,
		},
		"AK without certificate, CLI without AK roots": {
			nodeOpts:  bootstraptest.NodeOptions{Uncertified: true},
			validator: noRoots,
			wantErr:   recovery.ErrWrongNode,
		},
		"a worker's AK": {
			name: "worker-0", expected: "worker-0",
			nodeOpts: bootstraptest.NodeOptions{Role: metadata.Worker},
			wantErr:  recovery.ErrNotControlPlane,
		},
		"software key showing the image's PCRs": {
			issuer:  func(t *testing.T) attestation.Issuer { return bootstraptest.NewSoftwareIssuer(t, imagePCRs) },
			wantErr: recovery.ErrEvidence, wantReason: attestation.ErrUntrustedSigner,
		},
		"node committed to another cluster in this boot": {
			otherMark: true,
			wantErr:   recovery.ErrNotWaiting,
		},
	} {
		t.Run(name, func(t *testing.T) {
			nodeName := tc.name
			if nodeName == "" {
				nodeName = "control-plane-0"
			}
			nodeCA := ca
			if tc.ca != nil {
				nodeCA = tc.ca
			}
			keys := bootstraptest.NewClusterKeys(t)
			n := bootstraptest.NewNodeWith(t, nodeName, nodeCA, tc.nodeOpts)
			keys.CommitAndReboot(t, n)
			if tc.otherMark {
				other := sha256.Sum256([]byte("another cluster"))
				require.NoError(t, n.TPM.ExtendPCR(int(markerRegister), other[:]))
			}
			var opts bootstraptest.RecoveryServerOptions
			if tc.issuer != nil {
				opts.Issuer = tc.issuer(t)
			}
			srv := bootstraptest.StartRecoveryServer(t, n, opts)
			pcr15 := n.ClusterIDRegister(t)

			expected := tc.expected
			if expected == "" {
				expected = "control-plane-0"
			}
			cfg := config(t, ca, keys, srv.Addr, expected, n.DiskUUID(t))
			if tc.validator != nil {
				cfg.Validator = tc.validator
			}
			_, err := run(cfg)
			require.Error(t, err)
			assert.ErrorIs(t, err, tc.wantErr)
			if tc.wantReason != nil {
				assert.ErrorIs(t, err, tc.wantReason)
			}
			assert.ErrorContains(t, err, "nothing was sent")
			assert.False(t, recovery.Retryable(err), "a security failure is final")
			assert.Empty(t, srv.Calls.List(), "the node got no call, let alone a key")
			assert.Equal(t, pcr15, n.ClusterIDRegister(t), "PCR 15 unchanged")
			assert.False(t, n.Unlocked(t))
			assert.Zero(t, srv.Kubelet.Restarts())
		})
	}
}

// A genuine control plane of the image, certified for its own name and waiting for recovery,
// that holds another node's disk names that disk in its hello. The client refuses before it
// derives any key: the node was asked its disk and got nothing. Without the check the client
// derived and sent control-plane-0's disk key to control-plane-1 (with the copied disk, the
// node unlocked control-plane-0's data).
func TestRecoverRefusesAnotherNodesDisk(t *testing.T) {
	skipShort(t)
	ca := newCA(t)
	keys := bootstraptest.NewClusterKeys(t)
	for name, takeDisk := range map[string]func(t *testing.T, attacker, victim *bootstraptest.Node){
		"a copy of control-plane-0's disk": func(t *testing.T, attacker, victim *bootstraptest.Node) {
			attacker.HoldDiskOf(t, victim)
		},
		"its own disk relabelled with control-plane-0's UUID": func(t *testing.T, attacker, victim *bootstraptest.Node) {
			// The UUID is outside the encryption: whoever writes the disk can change it.
			require.NoError(t, os.WriteFile(filepath.Join(attacker.Storage.Dir, "uuid"), []byte(victim.DiskUUID(t)+"\n"), 0o600))
		},
	} {
		t.Run(name, func(t *testing.T) {
			victim := bootstraptest.NewNode(t, "control-plane-0", metadata.ControlPlane, ca)
			keys.CommitAndReboot(t, victim)
			attacker := bootstraptest.NewNode(t, "control-plane-1", metadata.ControlPlane, ca)
			keys.CommitAndReboot(t, attacker)
			// What the CLI recorded while the cluster ran.
			recorded, victimDisk := attacker.DiskUUID(t), victim.DiskUUID(t)
			takeDisk(t, attacker, victim)
			require.Equal(t, victimDisk, attacker.DiskUUID(t), "the node now names control-plane-0's disk")
			srv := bootstraptest.StartRecoveryServer(t, attacker, bootstraptest.RecoveryServerOptions{})

			_, err := run(config(t, ca, keys, srv.Addr, "control-plane-1", recorded))
			require.ErrorIs(t, err, recovery.ErrWrongDisk)
			assert.ErrorContains(t, err, `node "control-plane-1" names disk `+victimDisk+`, but its recorded disk is `+recorded)
			assert.ErrorContains(t, err, "no key was derived, nothing was sent")
			assert.False(t, recovery.Retryable(err), "a security failure is final")
			assert.Equal(t, []string{recoverpb.RecoverService_Hello_FullMethodName}, srv.Calls.Methods(), "asked for its disk, sent no key")
			assert.Equal(t, make([]byte, 32), attacker.ClusterIDRegister(t), "PCR 15 zero: the node still waits")
			assert.False(t, attacker.Unlocked(t))
			assert.Zero(t, srv.Kubelet.Restarts())

			// The disk's owner still recovers.
			owner := bootstraptest.StartRecoveryServer(t, victim, bootstraptest.RecoveryServerOptions{})
			_, err = run(config(t, ca, keys, owner.Addr, "control-plane-0", victimDisk))
			require.NoError(t, err)
			assert.True(t, victim.Unlocked(t))
		})
	}
}

// A node for which no disk is recorded is refused before the client connects: it would get
// the key of whatever disk it names.
func TestRecoverRefusesNodeWithoutRecordedDisk(t *testing.T) {
	skipShort(t)
	ca := newCA(t)
	keys := bootstraptest.NewClusterKeys(t)
	n := bootstraptest.NewNode(t, "control-plane-0", metadata.ControlPlane, ca)
	keys.CommitAndReboot(t, n)
	srv := bootstraptest.StartRecoveryServer(t, n, bootstraptest.RecoveryServerOptions{})

	_, err := run(config(t, ca, keys, srv.Addr, "control-plane-0", ""))
	require.ErrorContains(t, err, `no disk recorded for node "control-plane-0"`)
	assert.False(t, recovery.Retryable(err))
	assert.Empty(t, srv.Calls.List(), "no call, let alone a key")
	assert.Equal(t, make([]byte, 32), n.ClusterIDRegister(t))
	assert.False(t, n.Unlocked(t))
}

// A master secret that does not belong to the cluster of the state file is noticed before
// anything goes out.
func TestRecoverRefusesOtherClustersMasterSecret(t *testing.T) {
	skipShort(t)
	ca := newCA(t)
	keys := bootstraptest.NewClusterKeys(t)
	n := bootstraptest.NewNode(t, "control-plane-0", metadata.ControlPlane, ca)
	keys.CommitAndReboot(t, n)
	srv := bootstraptest.StartRecoveryServer(t, n, bootstraptest.RecoveryServerOptions{})

	cfg := config(t, ca, keys, srv.Addr, "control-plane-0", n.DiskUUID(t))
	cfg.MasterSecret = bootstraptest.NewClusterKeys(t).Master
	_, err := run(cfg)
	assert.ErrorIs(t, err, recovery.ErrWrongCluster)
	assert.ErrorContains(t, err, "nothing was sent")
	assert.Empty(t, srv.Calls.List())
}

// A port without a recovery server: a worker, or a node already back in its cluster.
func TestRecoverNoServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	keys := bootstraptest.NewClusterKeys(t)
	_, err = run(recovery.Config{
		Endpoint: addr, Validator: bootstraptest.Validator(t, newCA(t)), ExpectedNode: "worker-0", Disk: "3f2504e0-4f89-11d3-9a0c-0305e82c3301",
		MasterSecret: keys.Master, MeasurementSalt: keys.MeasurementSalt, ClusterID: keys.ClusterID,
	})
	assert.ErrorIs(t, err, recovery.ErrUnreachable)
	assert.ErrorIs(t, err, recovery.ErrNotWaiting)
	assert.ErrorContains(t, err, "no recovery server answers")
	assert.True(t, recovery.Retryable(err))
}

// A recovery server whose connection breaks during the attested handshake (it stopped because
// the node rejoined, or the network failed): unreachable, so retryable and not final, and the
// next attempt tells whether the node still waits.
func TestRecoverConnectionResetDuringHandshake(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			// Read the ClientHello, then reset the connection (no FIN: an RST).
			_, _ = conn.Read(make([]byte, 512))
			_ = conn.(*net.TCPConn).SetLinger(0)
			_ = conn.Close()
		}
	}()
	keys := bootstraptest.NewClusterKeys(t)
	_, err = run(recovery.Config{
		Endpoint: ln.Addr().String(), Validator: bootstraptest.Validator(t, newCA(t)), ExpectedNode: "control-plane-0", Disk: "3f2504e0-4f89-11d3-9a0c-0305e82c3301",
		MasterSecret: keys.Master, MeasurementSalt: keys.MeasurementSalt, ClusterID: keys.ClusterID,
	})
	require.Error(t, err)
	assert.ErrorIs(t, err, recovery.ErrUnreachable)
	assert.True(t, recovery.Retryable(err), "%v", err)
	assert.ErrorContains(t, err, "nothing was sent")
}

// A node whose handshake limits refuse the client for now: retryable, nothing sent.
func TestRecoverBusyNode(t *testing.T) {
	skipShort(t)
	ca := newCA(t)
	keys := bootstraptest.NewClusterKeys(t)
	n := bootstraptest.NewNode(t, "control-plane-0", metadata.ControlPlane, ca)
	keys.CommitAndReboot(t, n)
	now := time.Now()
	srv := bootstraptest.StartRecoveryServer(t, n, bootstraptest.RecoveryServerOptions{Now: func() time.Time { return now }})
	// Someone else at the client's address used up its handshakes.
	for range recoveryserver.DefaultHandshakeLimits.Burst {
		require.NoError(t, floodtest.Handshake(context.Background(), floodtest.Attacker(qemu.Variant), "127.0.0.1", srv.Addr))
	}
	_, err := run(config(t, ca, keys, srv.Addr, "control-plane-0", n.DiskUUID(t)))
	assert.ErrorIs(t, err, recovery.ErrBusy)
	assert.ErrorContains(t, err, "rate limited")
	assert.True(t, recovery.Retryable(err))
	assert.Empty(t, srv.Calls.List())
}

func TestConfigChecked(t *testing.T) {
	_, err := recovery.Recover(context.Background(), recovery.Config{MeasurementSalt: []byte("x")})
	for _, want := range []string{"no endpoint", "no validator", "no node name", "no disk recorded for node", "master secret: key has 0 bytes", "measurement salt has 1 bytes", "cluster ID has 0 bytes"} {
		assert.ErrorContains(t, err, want)
	}
	_, err = recovery.Recover(context.Background(), recovery.Config{ExpectedNode: "control-plane-0", Disk: "3F2504E0-4F89-11D3-9A0C-0305E82C3301"})
	assert.ErrorContains(t, err, `the disk recorded for node "control-plane-0", "3F2504E0-4F89-11D3-9A0C-0305E82C3301", is not a lower-case UUID`)
}

// A node with genuine evidence that answers nonsense (a bug, or a compromised node): the
// client refuses a disk name that is not a UUID before deriving anything, and a cluster ID
// other than the expected one.
func TestRecoverChecksTheNodesAnswers(t *testing.T) {
	skipShort(t)
	ca := newCA(t)
	keys := bootstraptest.NewClusterKeys(t)
	n := bootstraptest.NewNode(t, "control-plane-0", metadata.ControlPlane, ca)
	for name, tc := range map[string]struct {
		fake    *fakeNode
		wantErr error
		want    string
		recover bool
	}{
		"disk name not a UUID": {fake: &fakeNode{uuid: "../../../etc/passwd"}, want: "not a lower-case UUID"},
		"upper-case UUID":      {fake: &fakeNode{uuid: "3F2504E0-4F89-11D3-9A0C-0305E82C3301"}, want: "not a lower-case UUID"},
		"another cluster ID": {
			fake:    &fakeNode{uuid: "3f2504e0-4f89-11d3-9a0c-0305e82c3301", clusterID: bytes.Repeat([]byte{9}, 32)},
			wantErr: recovery.ErrWrongCluster, recover: true,
		},
		// The node's text reaches the operator's terminal: 256 KiB of escape sequences and
		// line breaks in a status, or as a cluster ID, arrive as one bounded, escaped line.
		"hostile status message": {
			fake:    &fakeNode{helloErr: status.Error(codes.FailedPrecondition, hostile(256<<10))},
			wantErr: recovery.ErrNotWaiting, want: `\x1b[2J\x1b]0;pwned\a\r\n`,
		},
		"hostile cluster ID": {
			fake:    &fakeNode{uuid: "3f2504e0-4f89-11d3-9a0c-0305e82c3301", clusterID: []byte(hostile(256 << 10))},
			wantErr: recovery.ErrWrongCluster, want: "bytes)", recover: true,
		},
	} {
		t.Run(name, func(t *testing.T) {
			creds, err := atls.NewCredentials(atls.Config{Issuer: n.Issuer(t)})
			require.NoError(t, err)
			g := grpc.NewServer(grpc.Creds(creds))
			recoverpb.RegisterRecoverServiceServer(g, tc.fake)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			go func() { _ = g.Serve(ln) }()
			t.Cleanup(g.Stop)

			_, err = run(config(t, ca, keys, ln.Addr().String(), "control-plane-0", "3f2504e0-4f89-11d3-9a0c-0305e82c3301"))
			require.Error(t, err)
			if tc.wantErr != nil {
				assert.ErrorIs(t, err, tc.wantErr)
			}
			assert.ErrorContains(t, err, tc.want)
			assert.Equal(t, tc.recover, tc.fake.recovered, "Recover called")
			assert.LessOrEqual(t, len(err.Error()), 1<<10)
			assert.NotContains(t, err.Error(), "\x1b")
			assert.NotContains(t, err.Error(), "\n")
		})
	}
}

type fakeNode struct {
	recoverpb.UnimplementedRecoverServiceServer
	uuid      string
	clusterID []byte
	helloErr  error
	recovered bool
}

func (f *fakeNode) Hello(context.Context, *recoverpb.HelloRequest) (*recoverpb.HelloResponse, error) {
	if f.helloErr != nil {
		return nil, f.helloErr
	}
	return &recoverpb.HelloResponse{DiskUuid: f.uuid}, nil
}

// hostile returns n bytes of what a node sends to act on the operator's terminal: clear the
// screen, set the window title, return to the line's start and forge a line.
func hostile(n int) string {
	const s = "\x1b[2J\x1b]0;pwned\x07\r\nlevel=ERROR msg=forged "
	return strings.Repeat(s, n/len(s)+1)[:n]
}

func (f *fakeNode) Recover(context.Context, *recoverpb.RecoverRequest) (*recoverpb.RecoverResponse, error) {
	f.recovered = true
	return &recoverpb.RecoverResponse{ClusterId: f.clusterID}, nil
}

// recover paces its attempts by the node's limits: MinAttemptInterval is the refill of one
// handshake and one Recover call of the recovery server's defaults.
func TestMinAttemptIntervalIsTheNodesRefill(t *testing.T) {
	for name, limits := range map[string]rate.Limit{
		"handshakes": recoveryserver.DefaultHandshakeLimits.Rate, "attempts": recoveryserver.DefaultAttemptLimits.Rate,
	} {
		assert.Equal(t, recovery.MinAttemptInterval, time.Duration(float64(time.Second)/float64(limits)), name)
	}
}

// markerRegister is the register of qemu-vtpm that carries the cluster-ID marker.
var markerRegister, _ = variant.QEMUVTPM.ClusterIDRegister()
