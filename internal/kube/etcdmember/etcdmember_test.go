package etcdmember_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/kube/etcdmember"
)

// fakeMember describes a member of fakeRunner's cluster.
type fakeMember struct {
	id      uint64
	name    string
	learner bool
	// down: its endpoint fails the health check; unstarted: it has no client URL.
	down, unstarted bool
}

// fakeRunner answers etcdctl's commands as etcdctl v3.6.5 prints them (see testdata) for a
// cluster of members, as seen from the member answeredBy.
type fakeRunner struct {
	members    []fakeMember
	answeredBy uint64
	// removeStderr, when set, makes member remove fail with it; keepRemoved makes it print
	// the removed member as still there.
	removeStderr string
	keepRemoved  bool
	// unhealthyRemovals makes that many member removes fail as etcd's strict reconfiguration
	// check does right after a member (re)connected.
	unhealthyRemovals int
	// healthFails makes endpoint health fail without output.
	healthFails bool
	calls       []string
}

func clientURL(m fakeMember) string { return fmt.Sprintf("https://10.42.0.%d:2379", 10+m.id) }

func (f *fakeRunner) list(skip uint64) []byte {
	type member struct {
		ID         uint64   `json:"ID"`
		Name       string   `json:"name,omitempty"`
		PeerURLs   []string `json:"peerURLs"`
		ClientURLs []string `json:"clientURLs,omitempty"`
		IsLearner  bool     `json:"isLearner,omitempty"`
	}
	out := struct {
		Header  map[string]uint64 `json:"header"`
		Members []member          `json:"members"`
	}{Header: map[string]uint64{"cluster_id": 99, "member_id": f.answeredBy, "raft_term": 2}}
	for _, m := range f.members {
		if m.id == skip {
			continue
		}
		mm := member{ID: m.id, Name: m.name, PeerURLs: []string{fmt.Sprintf("https://10.42.0.%d:2380", 10+m.id)}, IsLearner: m.learner}
		if !m.unstarted {
			mm.ClientURLs = []string{clientURL(m)}
		}
		out.Members = append(out.Members, mm)
	}
	data, _ := json.Marshal(out)
	return data
}

func (f *fakeRunner) Run(_ context.Context, args ...string) ([]byte, []byte, error) {
	f.calls = append(f.calls, strings.Join(args, " "))
	switch {
	case len(args) >= 2 && args[0] == "member" && args[1] == "list":
		return f.list(0), nil, nil
	case len(args) >= 2 && args[0] == "endpoint" && args[1] == "health":
		if f.healthFails {
			return nil, []byte("Error: failed to fetch endpoints from etcd cluster member list: context deadline exceeded\n"), etcdmember.NewExitError(1, []byte("Error: failed to fetch endpoints"))
		}
		type health struct {
			Endpoint string `json:"endpoint"`
			Health   bool   `json:"health"`
			Took     string `json:"took"`
			Error    string `json:"error,omitempty"`
		}
		var out []health
		unhealthy := false
		for _, m := range f.members {
			if m.unstarted {
				continue
			}
			h := health{Endpoint: clientURL(m), Health: !m.down, Took: "3.1ms"}
			if m.down {
				h.Took, h.Error, unhealthy = "5.0017s", "context deadline exceeded", true
			}
			out = append(out, h)
		}
		data, _ := json.Marshal(out)
		if unhealthy {
			return data, []byte("Error: unhealthy cluster\n"), etcdmember.NewExitError(1, []byte("Error: unhealthy cluster\n"))
		}
		return data, nil, nil
	case len(args) >= 3 && args[0] == "member" && args[1] == "remove":
		if f.unhealthyRemovals > 0 {
			f.unhealthyRemovals--
			const stderr = "Error: etcdserver: unhealthy cluster\n"
			return nil, []byte(stderr), etcdmember.NewExitError(1, []byte(stderr))
		}
		if f.removeStderr != "" {
			return nil, []byte(f.removeStderr), etcdmember.NewExitError(1, []byte(f.removeStderr))
		}
		var id uint64
		_, err := fmt.Sscanf(args[2], "%x", &id)
		if err != nil {
			return nil, []byte("Error: bad member ID arg"), etcdmember.NewExitError(1, []byte("Error: bad member ID arg"))
		}
		if f.keepRemoved {
			id = 0
		}
		return f.list(id), nil, nil
	}
	return nil, []byte("Error: unknown command"), etcdmember.NewExitError(1, []byte("Error: unknown command"))
}

func (f *fakeRunner) removed() bool {
	for _, c := range f.calls {
		if strings.HasPrefix(c, "member remove") {
			return true
		}
	}
	return false
}

func three(downs ...string) []fakeMember {
	ms := []fakeMember{{id: 1, name: "cp-0"}, {id: 2, name: "cp-1"}, {id: 3, name: "cp-2"}}
	for i := range ms {
		for _, d := range downs {
			if ms[i].name == d {
				ms[i].down = true
			}
		}
	}
	return ms
}

func TestPlanRemove(t *testing.T) {
	testCases := map[string]struct {
		members    []fakeMember
		answeredBy uint64
		node       string
		// wantRefused is part of the refusal; empty: allowed.
		wantRefused  string
		wantNoMember bool
		wantMember   uint64
		wantRemain   []string
	}{
		"healthy member of three": {
			members: three(), answeredBy: 1, node: "cp-1",
			wantMember: 2, wantRemain: []string{"cp-0 (healthy)", "cp-2 (healthy)"},
		},
		"healthy member while another is down": {
			members: three("cp-2"), answeredBy: 1, node: "cp-1",
			wantRefused: "after the removal 1 of the 2 remaining voting members would be healthy, and etcd needs 2 for quorum; members: cp-0 (healthy), cp-1 (healthy), cp-2 (unhealthy: context deadline exceeded)",
		},
		"the member that is down": {
			members: three("cp-2"), answeredBy: 1, node: "cp-2",
			wantMember: 3, wantRemain: []string{"cp-0 (healthy)", "cp-1 (healthy)"},
		},
		"one of two": {
			members: []fakeMember{{id: 1, name: "cp-0"}, {id: 2, name: "cp-1"}}, answeredBy: 1, node: "cp-1",
			wantMember: 2, wantRemain: []string{"cp-0 (healthy)"},
		},
		"last member": {
			members: []fakeMember{{id: 1, name: "cp-0"}}, answeredBy: 1, node: "cp-0",
			wantRefused: "it is the last member",
		},
		"last voting member": {
			members: []fakeMember{{id: 1, name: "cp-0"}, {id: 2, name: "cp-1", learner: true}}, answeredBy: 2, node: "cp-0",
			wantRefused: "it is the last voting member",
		},
		"the member etcdctl talks to": {
			members: three(), answeredBy: 2, node: "cp-1",
			wantRefused: "etcdctl runs against this very member",
		},
		"no member": {
			members: three(), answeredBy: 1, node: "cp-7",
			wantNoMember: true,
		},
		"learner while a voter is down": {
			members: append(three("cp-2"), fakeMember{id: 4, name: "cp-3", learner: true}), answeredBy: 1, node: "cp-3",
			wantMember: 4, wantRemain: []string{"cp-0 (healthy)", "cp-1 (healthy)", "cp-2 (unhealthy: context deadline exceeded)"},
		},
		"healthy member of five with two down": {
			members: []fakeMember{{id: 1, name: "cp-0"}, {id: 2, name: "cp-1"}, {id: 3, name: "cp-2"}, {id: 4, name: "cp-3", down: true}, {id: 5, name: "cp-4", down: true}}, answeredBy: 1, node: "cp-1",
			wantRefused: "2 of the 4 remaining voting members would be healthy, and etcd needs 3",
		},
		"down member of five with two down": {
			members: []fakeMember{{id: 1, name: "cp-0"}, {id: 2, name: "cp-1"}, {id: 3, name: "cp-2"}, {id: 4, name: "cp-3", down: true}, {id: 5, name: "cp-4", down: true}}, answeredBy: 1, node: "cp-4",
			wantMember: 5, wantRemain: []string{"cp-0 (healthy)", "cp-1 (healthy)", "cp-2 (healthy)", "cp-3 (unhealthy: context deadline exceeded)"},
		},
		"an unstarted voter counts as unhealthy": {
			members: []fakeMember{{id: 1, name: "cp-0"}, {id: 2, name: "cp-1"}, {id: 3, unstarted: true}}, answeredBy: 1, node: "cp-1",
			wantRefused: "(unstarted 3) (unhealthy: not started (no client URLs))",
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			runner := &fakeRunner{members: tc.members, answeredBy: tc.answeredBy}
			c := etcdmember.New(runner, 0)
			plan, err := c.PlanRemove(context.Background(), tc.node)
			assert.False(t, runner.removed(), "planning removes nothing")

			removal, removeErr := c.Remove(context.Background(), tc.node)
			if tc.wantRefused != "" {
				for _, err := range []error{err, removeErr} {
					var refused *etcdmember.RefusedError
					require.ErrorAs(t, err, &refused)
					assert.Contains(t, err.Error(), tc.wantRefused)
					assert.Contains(t, err.Error(), "refusing to remove the etcd member of node "+tc.node)
				}
				assert.False(t, runner.removed(), "refused: nothing removed")
				return
			}
			require.NoError(t, err)
			require.NoError(t, removeErr)
			assert.Equal(t, plan, removal)
			assert.Equal(t, tc.wantNoMember, removal.NoMember)
			if tc.wantNoMember {
				assert.False(t, runner.removed(), "nothing to remove")
				assert.Contains(t, removal.String(), "node cp-7 has no etcd member (already removed?)")
				return
			}
			assert.Equal(t, tc.wantMember, removal.Member.ID)
			assert.Equal(t, tc.node, removal.Member.Name)
			var remain []string
			for _, m := range removal.Remaining {
				remain = append(remain, m.String())
			}
			assert.Equal(t, tc.wantRemain, remain)
			assert.Contains(t, runner.calls, fmt.Sprintf("member remove %x -w json", tc.wantMember))
		})
	}
}

func TestRemoveOutcomes(t *testing.T) {
	t.Run("removed by someone else meanwhile", func(t *testing.T) {
		runner := &fakeRunner{members: three(), answeredBy: 1, removeStderr: "Error: etcdserver: member not found\n"}
		removal, err := etcdmember.New(runner, 0).Remove(context.Background(), "cp-1")
		require.NoError(t, err)
		assert.True(t, removal.NoMember)
	})
	t.Run("etcd refuses", func(t *testing.T) {
		runner := &fakeRunner{members: three(), answeredBy: 1, removeStderr: "Error: etcdserver: re-configuration failed due to not enough started members\n"}
		_, err := etcdmember.New(runner, 0).Remove(context.Background(), "cp-1")
		var exit *etcdmember.ExitError
		require.ErrorAs(t, err, &exit)
		assert.Contains(t, err.Error(), "removing etcd member 2 of node cp-1: etcdctl exited with code 1: Error: etcdserver: re-configuration failed")
	})
	t.Run("etcd waits for its members to be connected a while", func(t *testing.T) {
		runner := &fakeRunner{members: three(), answeredBy: 1, unhealthyRemovals: 1}
		removal, err := etcdmember.New(runner, 0).Remove(context.Background(), "cp-1")
		require.NoError(t, err)
		assert.Equal(t, "cp-1", removal.Member.Name)
		assert.Equal(t, 0, runner.unhealthyRemovals, "retried")
	})
	t.Run("still listed after removal", func(t *testing.T) {
		runner := &fakeRunner{members: three(), answeredBy: 1, keepRemoved: true}
		_, err := etcdmember.New(runner, 0).Remove(context.Background(), "cp-1")
		require.Error(t, err)
		assert.Contains(t, err.Error(), "etcd still lists it after the removal")
	})
	t.Run("health unknown", func(t *testing.T) {
		runner := &fakeRunner{members: three(), answeredBy: 1, healthFails: true}
		_, err := etcdmember.New(runner, 0).Remove(context.Background(), "cp-1")
		require.Error(t, err)
		assert.Contains(t, err.Error(), "checking etcd member health: etcdctl exited with code 1: Error: failed to fetch endpoints")
		assert.False(t, runner.removed(), "fails closed")
	})
}

func TestMembersHealth(t *testing.T) {
	runner := &fakeRunner{members: append(three("cp-2"), fakeMember{id: 4, learner: true, unstarted: true}), answeredBy: 1}
	members, err := etcdmember.New(runner, 0).Members(context.Background())
	require.NoError(t, err)
	var got []string
	for _, m := range members {
		got = append(got, m.String())
	}
	assert.Equal(t, []string{
		"(unstarted 4) (learner, unhealthy: not started (no client URLs))",
		"cp-0 (healthy)", "cp-1 (healthy)", "cp-2 (unhealthy: context deadline exceeded)",
	}, got)
	assert.Contains(t, runner.calls, "endpoint health --cluster -w json --command-timeout=5s")
}

// flakyRunner fails the first runs of a command (by its first two words) with scripted errors,
// then answers as inner does. lost makes the first member remove apply the removal and lose
// the answer (a timeout), as etcd does when its leader goes away mid-request.
type flakyRunner struct {
	inner *fakeRunner
	fail  map[string][]error
	lost  bool
	runs  []string
}

func (f *flakyRunner) Run(ctx context.Context, args ...string) ([]byte, []byte, error) {
	cmd := strings.Join(args[:2], " ")
	f.runs = append(f.runs, cmd)
	if errs := f.fail[cmd]; len(errs) > 0 {
		f.fail[cmd] = errs[1:]
		var exit *etcdmember.ExitError
		if errors.As(errs[0], &exit) {
			return nil, []byte(exit.Stderr), errs[0]
		}
		return nil, nil, errs[0]
	}
	if cmd == "member remove" && !slices.ContainsFunc(f.inner.members, func(m fakeMember) bool { return fmt.Sprintf("%x", m.id) == args[2] }) {
		const stderr = "Error: etcdserver: member not found"
		return nil, []byte(stderr), etcdmember.NewExitError(1, []byte(stderr))
	}
	if cmd == "member remove" && f.lost {
		f.lost = false
		f.inner.members = slices.DeleteFunc(f.inner.members, func(m fakeMember) bool { return fmt.Sprintf("%x", m.id) == args[2] })
		const stderr = "Error: etcdserver: request timed out, possibly due to previous leader failure"
		return nil, []byte(stderr), etcdmember.NewExitError(1, []byte(stderr))
	}
	stdout, stderr, err := f.inner.Run(ctx, args...)
	if cmd == "member remove" && err == nil {
		f.inner.members = slices.DeleteFunc(f.inner.members, func(m fakeMember) bool { return fmt.Sprintf("%x", m.id) == args[2] })
	}
	return stdout, stderr, err
}

// instantClock fires every wait at once, recording it.
type instantClock struct {
	now   time.Time
	waits []time.Duration
}

func (c *instantClock) Now() time.Time { return c.now }
func (c *instantClock) After(d time.Duration) <-chan time.Time {
	c.waits = append(c.waits, d)
	c.now = c.now.Add(d)
	ch := make(chan time.Time, 1)
	ch <- c.now
	return ch
}

// Removing a control plane while etcd elects a leader (the member removed before was the
// leader), or while the API server's exec connection is reset: the runs are retried, and a
// removal whose answer was lost counts as done.
func TestRemoveRetriesTransientFailures(t *testing.T) {
	exit := func(stderr string) error { return etcdmember.NewExitError(1, []byte(stderr)) }
	reset := &net.OpError{Op: "read", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	testCases := map[string]struct {
		fail       map[string][]error
		lost       bool
		wantErr    []string
		wantNoMem  bool
		wantRuns   int
		wantWaited int
	}{
		"leader changed while listing": {
			fail:     map[string][]error{"member list": {exit("Error: etcdserver: leader changed"), exit("Error: etcdserver: no leader")}},
			wantRuns: 5, wantWaited: 2,
		},
		"exec connection reset, then request timed out": {
			fail:     map[string][]error{"endpoint health": {fmt.Errorf("exec in kube-system/etcd-cp-0: %w", reset)}, "member remove": {exit("Error: etcdserver: request timed out")}},
			wantRuns: 5, wantWaited: 2,
		},
		"the removal's answer was lost: removed": {
			lost: true, wantNoMem: true, wantRuns: 4, wantWaited: 1,
		},
		"strict reconfiguration check": {
			fail:     map[string][]error{"member remove": {exit("Error: etcdserver: unhealthy cluster"), exit("Error: etcdserver: unhealthy cluster")}},
			wantRuns: 5, wantWaited: 2,
		},
		"a refusal that waiting does not change: at once": {
			fail:     map[string][]error{"member remove": {exit("Error: etcdserver: re-configuration failed due to not enough started members")}},
			wantErr:  []string{"re-configuration failed"},
			wantRuns: 3,
		},
		"transient for longer than RetryFor: first and last error": {
			fail: map[string][]error{"member list": {
				exit("Error: etcdserver: leader changed"), exit("Error: context deadline exceeded"), exit("Error: context deadline exceeded"),
				exit("Error: context deadline exceeded"), exit("Error: context deadline exceeded"), exit("Error: context deadline exceeded"),
				exit("Error: context deadline exceeded"), exit("Error: context deadline exceeded"), exit("Error: context deadline exceeded"),
			}},
			wantErr: []string{"listing etcd members", "context deadline exceeded", "first error: etcdctl exited with code 1: Error: etcdserver: leader changed", "gave up"},
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			runner := &flakyRunner{inner: &fakeRunner{members: three(), answeredBy: 1}, fail: tc.fail, lost: tc.lost}
			c := etcdmember.New(runner, 0)
			clock := &instantClock{now: time.Now()}
			c.Retry.Clock = clock
			c.RetryFor = 10 * time.Second
			removal, err := c.Remove(context.Background(), "cp-1")
			if len(tc.wantErr) > 0 {
				require.Error(t, err)
				for _, want := range tc.wantErr {
					assert.Contains(t, err.Error(), want)
				}
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.wantNoMem, removal.NoMember)
			assert.NotContains(t, fakeNames(runner.inner.members), "cp-1")
			assert.Len(t, runner.runs, tc.wantRuns, "runs: %v", runner.runs)
			assert.Len(t, clock.waits, tc.wantWaited)
		})
	}
}

// A quorum refusal because a member is unhealthy says it may pass (a member catching up after a
// membership change); a refusal for the last member does not.
func TestRefusalTransient(t *testing.T) {
	runner := &fakeRunner{members: three("cp-2"), answeredBy: 1}
	_, err := etcdmember.New(runner, 0).PlanRemove(context.Background(), "cp-1")
	var refused *etcdmember.RefusedError
	require.ErrorAs(t, err, &refused)
	assert.True(t, refused.Transient())

	runner = &fakeRunner{members: []fakeMember{{id: 1, name: "cp-0"}}, answeredBy: 1}
	_, err = etcdmember.New(runner, 0).PlanRemove(context.Background(), "cp-0")
	require.ErrorAs(t, err, &refused)
	assert.False(t, refused.Transient())
}

func fakeNames(ms []fakeMember) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.name)
	}
	return out
}

func TestQuorumWhileDown(t *testing.T) {
	m := func(name string, healthy, learner bool) etcdmember.Member {
		return etcdmember.Member{ID: uint64(len(name)), Name: name, Healthy: healthy, IsLearner: learner}
	}
	testCases := map[string]struct {
		removal etcdmember.Removal
		want    bool
	}{
		"3 healthy: 2 of 3 keep quorum": {etcdmember.Removal{Member: m("a", true, false), Remaining: []etcdmember.Member{m("bb", true, false), m("ccc", true, false)}}, true},
		"2 members: 1 of 2 has none":    {etcdmember.Removal{Member: m("a", true, false), Remaining: []etcdmember.Member{m("bb", true, false)}}, false},
		"3 members, another one down":   {etcdmember.Removal{Member: m("a", true, false), Remaining: []etcdmember.Member{m("bb", true, false), m("ccc", false, false)}}, false},
		"5 members, one other down":     {etcdmember.Removal{Member: m("a", true, false), Remaining: []etcdmember.Member{m("b", true, false), m("cc", true, false), m("ddd", true, false), m("eeee", false, false)}}, true},
		"a learner counts for nothing":  {etcdmember.Removal{Member: m("a", true, false), Remaining: []etcdmember.Member{m("bb", true, false), m("ccc", true, true)}}, false},
		"removing a learner":            {etcdmember.Removal{Member: m("a", true, true), Remaining: []etcdmember.Member{m("bb", true, false)}}, true},
		"no member":                     {etcdmember.Removal{NoMember: true}, true},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, tc.removal.QuorumWhileDown())
		})
	}
}
