package joinservice_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/openconstellation/constellation/api/join/joinpb"
	"github.com/openconstellation/constellation/internal/diskowner"
	"github.com/openconstellation/constellation/internal/handshakelimit"
)

func (e *env) rejoin(j *joiner) (*joinpb.IssueRejoinTicketResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn := e.conn(j)
	defer conn.Close()
	return joinpb.NewJoinServiceClient(conn).IssueRejoinTicket(ctx, &joinpb.IssueRejoinTicketRequest{DiskUuid: j.diskUUID, ClientCertificateRequest: j.clientCSR(j.clientKey)})
}

// recordedOwner reads the disk-owner record as the API server has it.
func recordedOwner(t *testing.T, diskUUID string) string {
	t.Helper()
	owner, err := diskowner.Store{Client: kube.Admin}.Owner(context.Background(), diskUUID)
	require.NoError(t, err)
	return owner
}

// A state-disk key goes only to the node the disk belongs to, recorded when its join ticket
// was issued (or, for the init node, at init). The attacker is an attested node of the right
// image whose certified AK names it worker-1 (or control-plane-1): it asks for other nodes'
// disks. Each case fails on a service that derives a key for any UUID it is asked for.
func TestDiskKeysFollowIdentity(t *testing.T) {
	e := newEnv(t, envOptions{})
	// worker-0 joined: its disk is recorded as worker-0's.
	victim := e.joiner("worker-0", "127.0.3.1")
	_, err := e.join(victim, false)
	require.NoError(t, err)
	owner, err := diskowner.Store{Client: kube.Admin}.Owner(context.Background(), victim.diskUUID)
	assert.NoError(t, err, "the join ticket records the disk's owner")
	assert.Equal(t, "worker-0", owner)
	// control-plane-0 ran init, which recorded its disk (the init server's call; the init
	// server's own test checks it makes it).
	initDisk := newDiskUUID()
	owner, err = diskowner.Store{Client: kube.Admin}.Claim(context.Background(), initDisk, "control-plane-0")
	require.NoError(t, err)
	require.Equal(t, "control-plane-0", owner)
	// worker-2 joined, then the platform removed it (instance deleted); its record remains.
	removed := e.joiner("worker-2", "127.0.3.2")
	_, err = e.join(removed, false)
	require.NoError(t, err)
	e.removed.Store("worker-2", true)
	// worker-9 joined, then the CLI removed it from the cluster (scaled down), but the
	// platform lists its name again (a re-created machine, an autoscaler reusing names).
	relisted := e.joiner("worker-9", "127.0.3.3")
	_, err = e.join(relisted, false)
	require.NoError(t, err)
	require.NoError(t, diskowner.Store{Client: kube.Admin}.MarkRemoved(context.Background(), "worker-9", time.Now()))

	testCases := map[string]struct {
		node         string
		disk         string
		rejoin       bool
		controlPlane bool
		wantCode     codes.Code
		wantReason   string
		wantMsg      string
	}{
		"rejoin for another node's disk": {
			node: "worker-1", disk: victim.diskUUID, rejoin: true,
			wantCode: codes.PermissionDenied, wantReason: "disk-owned-by-other-node", wantMsg: "belongs to another node",
		},
		"rejoin for another node's disk, UUID in lower case": {
			node: "worker-1", disk: strings.ToLower(victim.diskUUID), rejoin: true,
			wantCode: codes.PermissionDenied, wantReason: "disk-owned-by-other-node", wantMsg: "belongs to another node",
		},
		"join ticket for another node's recorded disk": {
			node: "worker-1", disk: victim.diskUUID,
			wantCode: codes.PermissionDenied, wantReason: "disk-owned-by-other-node", wantMsg: "belongs to another node",
		},
		"rejoin for a disk nobody recorded": {
			node: "worker-1", disk: newDiskUUID(), rejoin: true,
			wantCode: codes.PermissionDenied, wantReason: "disk-not-recorded", wantMsg: "has no recorded owner",
		},
		"another control plane rejoins the init node's disk": {
			node: "control-plane-1", disk: initDisk, rejoin: true,
			wantCode: codes.PermissionDenied, wantReason: "disk-owned-by-other-node", wantMsg: "belongs to another node",
		},
		"another control plane asks a join ticket for the init node's disk": {
			node: "control-plane-1", disk: initDisk, controlPlane: true,
			wantCode: codes.PermissionDenied, wantReason: "disk-owned-by-other-node", wantMsg: "belongs to another node",
		},
		"removed node rejoins its own disk": {
			node: "worker-2", disk: removed.diskUUID, rejoin: true,
			wantCode: codes.PermissionDenied, wantReason: "unknown-node", wantMsg: "platform does not know this node",
		},
		"removed node asks a join ticket for its own disk": {
			node: "worker-2", disk: removed.diskUUID,
			wantCode: codes.PermissionDenied, wantReason: "unknown-node", wantMsg: "platform does not know this node",
		},
		"removed node the platform lists again rejoins its own disk": {
			node: "worker-9", disk: relisted.diskUUID, rejoin: true,
			wantCode: codes.PermissionDenied, wantReason: "removed-node", wantMsg: "was removed from the cluster",
		},
		"removed node the platform lists again asks a join ticket": {
			node: "worker-9", disk: newDiskUUID(),
			wantCode: codes.PermissionDenied, wantReason: "removed-node", wantMsg: "was removed from the cluster",
		},
		"same node retries its join": {node: "worker-0", disk: victim.diskUUID, wantCode: codes.OK},
		"owner rejoins":              {node: "worker-0", disk: victim.diskUUID, rejoin: true, wantCode: codes.OK},
		"init node rejoins its disk": {node: "control-plane-0", disk: initDisk, rejoin: true, wantCode: codes.OK},
	}
	i := 10
	for name, tc := range testCases {
		i++
		t.Run(name, func(t *testing.T) {
			j := e.joiner(tc.node, fmt.Sprintf("127.0.3.%d", i))
			j.diskUUID = tc.disk
			stage := "join"
			if tc.rejoin {
				stage = "rejoin"
			}
			keysBefore := e.keys.calls.Load()
			rejectedBefore := e.counter("constellation_joinservice_rejections_total", "stage", stage, "reason", tc.wantReason)

			var diskKey []byte
			if tc.rejoin {
				resp, err := e.rejoin(j)
				assert.Equal(t, tc.wantCode, status.Code(err), "%v", err)
				if err != nil {
					assert.Nil(t, resp, "no key in a refused response")
				} else {
					diskKey = resp.StateDiskKey
				}
			} else {
				resp, err := e.join(j, tc.controlPlane)
				assert.Equal(t, tc.wantCode, status.Code(err), "%v", err)
				if err != nil {
					assert.Nil(t, resp, "no key in a refused response")
				} else {
					diskKey = resp.StateDiskKey
				}
			}
			recorded := e.logLines("admission rejected")
			if tc.wantCode == codes.OK {
				want, err := e.secret.StateDiskKey(strings.ToLower(tc.disk))
				require.NoError(t, err)
				assert.Equal(t, want, diskKey)
				return
			}
			assert.Equal(t, keysBefore, e.keys.calls.Load(), "a refused request must not derive keys")
			assert.Equal(t, rejectedBefore+1, e.counter("constellation_joinservice_rejections_total", "stage", stage, "reason", tc.wantReason))
			require.NotEmpty(t, recorded)
			last := recorded[len(recorded)-1]
			assert.Equal(t, tc.wantReason, last["reason"])
			assert.Contains(t, last["error"], tc.wantMsg)
		})
	}
	// The records were never rewritten by the attempts.
	assert.Equal(t, "worker-0", recordedOwner(t, victim.diskUUID))
	assert.Equal(t, "control-plane-0", recordedOwner(t, initDisk))
}

// Two nodes race for one disk's join ticket: exactly one wins, and only it gets a key.
func TestDiskClaimRace(t *testing.T) {
	e := newEnv(t, envOptions{})
	disk := newDiskUUID()
	a, b := e.joiner("worker-0", "127.0.4.1"), e.joiner("worker-1", "127.0.4.2")
	a.diskUUID, b.diskUUID = disk, disk
	errs := make(chan error, 2)
	for _, j := range []*joiner{a, b} {
		go func() {
			_, err := e.join(j, false)
			errs <- err
		}()
	}
	var ok, denied int
	for range 2 {
		switch err := <-errs; status.Code(err) {
		case codes.OK:
			ok++
		case codes.PermissionDenied:
			denied++
			assert.ErrorContains(t, err, "belongs to another node")
		default:
			t.Errorf("unexpected result: %v", err)
		}
	}
	assert.Equal(t, 1, ok)
	assert.Equal(t, 1, denied)
	cm, err := kube.Admin.CoreV1().ConfigMaps(diskowner.Namespace).Get(context.Background(), "disk-"+strings.ToLower(disk), metav1.GetOptions{})
	require.NoError(t, err)
	assert.True(t, *cm.Immutable)
	assert.Contains(t, []string{"worker-0", "worker-1"}, cm.Data[diskowner.NodeKey])
}

// A peer's strings are not echoed whole: a 1 MiB disk UUID yields a short gRPC status and a
// short log line.
func TestPeerStringsTruncated(t *testing.T) {
	e := newEnv(t, envOptions{})
	huge := strings.Repeat("A", 1<<20)
	for name, rejoin := range map[string]bool{"join": false, "rejoin": true} {
		t.Run(name, func(t *testing.T) {
			j := e.joiner("worker-0", "127.0.5.1")
			if rejoin {
				j.local = net.ParseIP("127.0.5.2")
			}
			j.diskUUID = huge
			var err error
			if rejoin {
				_, err = e.rejoin(j)
			} else {
				_, err = e.join(j, false)
			}
			require.Error(t, err)
			assert.Equal(t, codes.InvalidArgument, status.Code(err), "%v", shorten(err))
			msg := status.Convert(err).Message()
			assert.Less(t, len(msg), 512, "the status echoes the peer's UUID: %s", shorten(err))
			assert.Contains(t, msg, `"AAAA`)
			assert.Contains(t, msg, "(1048576 bytes)")

			lines := e.rawLogLines("admission rejected")
			require.NotEmpty(t, lines)
			last := lines[len(lines)-1]
			assert.Less(t, len(last), 2048, "the log line echoes the peer's UUID")
			assert.Contains(t, last, "invalid-request")
		})
	}
}

func shorten(err error) string {
	if err == nil {
		return "<nil>"
	}
	s := err.Error()
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}

// 1,000 garbage connections from one address: each is refused and counted, but the log gets
// one line, and the next line after the interval reports how many were suppressed.
func TestGarbageFloodLogsFewLines(t *testing.T) {
	const n = 1000
	// Every connection reaches the handshake (the accept-time bound is tested on its own).
	e := newEnv(t, envOptions{accept: handshakelimit.AcceptLimits{PerPeer: n, Total: n}})
	send := func() {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.6.1")}, Timeout: 10 * time.Second}
		conn, err := d.Dial("tcp", e.addr)
		require.NoError(t, err)
		_, _ = conn.Write([]byte("GET / HTTP/1.1\r\nHost: join\r\n\r\n"))
		_ = conn.Close()
	}
	counted := func() float64 {
		return e.counter("constellation_joinservice_rejections_total", "stage", "handshake", "reason", "protocol")
	}
	for range n {
		send()
	}
	require.Eventually(t, func() bool { return counted() == n }, 60*time.Second, 20*time.Millisecond,
		"every garbage connection is counted (have %v)", counted())
	lines := e.logLines("admission rejected")
	assert.LessOrEqual(t, len(lines), 3, "a flood from one address writes a handful of lines")
	require.NotEmpty(t, lines)
	assert.Equal(t, "127.0.6.1", lines[0]["peer"], "the first rejection of a peer is logged")
	assert.Equal(t, "protocol", lines[0]["reason"])

	// After the interval, the next rejection is logged with the count of those suppressed:
	// the lines account for every rejection.
	e.clock.Add(int64(11 * time.Second))
	send()
	require.Eventually(t, func() bool { return counted() == n+1 }, 30*time.Second, 20*time.Millisecond)
	// The counter is incremented before the line is written: poll the log, with a deadline.
	total := func() int {
		sum := 0
		for _, l := range e.logLines("admission rejected") {
			sum++
			if s, ok := l["suppressed"].(float64); ok {
				sum += int(s)
			}
		}
		return sum
	}
	require.Eventually(t, func() bool { return total() == n+1 }, 30*time.Second, 20*time.Millisecond,
		"logged lines plus their suppressed counts account for every rejection (have %d)", total())
	assert.LessOrEqual(t, len(e.logLines("admission rejected")), 4)
}
