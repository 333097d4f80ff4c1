// Package etcdmember lists and removes the etcd members of control-plane nodes, from where the
// CLI stands: it has the admin kubeconfig, but cannot reach etcd's port or read a node's files.
// So it runs etcdctl inside the etcd static pod of a control plane that stays (kubectl exec
// through the API server, PodRunner), with the certificates kubeadm mounts into that pod.
//
// kubeadm names every etcd member after its node, so a node's member is the member of that
// name. Removal refuses to break quorum: see PlanRemove.
package etcdmember

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Member is an etcd member and its health.
type Member struct {
	ID uint64
	// Name is the member's name: its node's name in a kubeadm cluster. Empty for a member that
	// was added but has not started.
	Name       string
	PeerURLs   []string
	ClientURLs []string
	// IsLearner: a non-voting member (does not count for quorum).
	IsLearner bool
	// Healthy: the member answered a linearizable read (etcdctl endpoint health).
	Healthy bool
	// HealthError says why a member is not healthy.
	HealthError string
}

// IDString is the member ID as etcdctl takes and prints it in text (hex).
func (m Member) IDString() string { return strconv.FormatUint(m.ID, 16) }

func (m Member) String() string {
	name := m.Name
	if name == "" {
		name = "(unstarted " + m.IDString() + ")"
	}
	var attrs []string
	if m.IsLearner {
		attrs = append(attrs, "learner")
	}
	if m.Healthy {
		attrs = append(attrs, "healthy")
	} else {
		attrs = append(attrs, "unhealthy: "+m.HealthError)
	}
	return name + " (" + strings.Join(attrs, ", ") + ")"
}

// Client lists and removes etcd members through etcdctl.
type Client struct {
	runner Runner
	// healthTimeout bounds each member's health check (etcdctl --command-timeout).
	healthTimeout time.Duration
}

// DefaultHealthTimeout is how long a member may take to answer the health check (etcdctl's own
// default command timeout).
const DefaultHealthTimeout = 5 * time.Second

// New returns a client running etcdctl through runner; healthTimeout bounds each member's
// health check (DefaultHealthTimeout when zero).
func New(runner Runner, healthTimeout time.Duration) *Client {
	if healthTimeout <= 0 {
		healthTimeout = DefaultHealthTimeout
	}
	return &Client{runner: runner, healthTimeout: healthTimeout}
}

// Members lists the cluster's members with their health, sorted by name and ID.
func (c *Client) Members(ctx context.Context) ([]Member, error) {
	members, _, err := c.members(ctx)
	return members, err
}

func (c *Client) members(ctx context.Context) ([]Member, uint64, error) {
	stdout, _, err := c.runner.Run(ctx, "member", "list", "-w", "json")
	if err != nil {
		return nil, 0, fmt.Errorf("listing etcd members: %w", err)
	}
	members, answeredBy, err := ParseMemberList(stdout)
	if err != nil {
		return nil, 0, err
	}
	// etcdctl exits 1 when an endpoint is unhealthy, after printing every result.
	stdout, _, err = c.runner.Run(ctx, "endpoint", "health", "--cluster", "-w", "json",
		"--command-timeout="+c.healthTimeout.String())
	var exit *ExitError
	if err != nil && !(errors.As(err, &exit) && exit.Code == 1 && len(stdout) > 0) {
		return nil, 0, fmt.Errorf("checking etcd member health: %w", err)
	}
	health, err := ParseEndpointHealth(stdout)
	if err != nil {
		return nil, 0, err
	}
	byEndpoint := map[string]EndpointHealth{}
	for _, h := range health {
		byEndpoint[h.Endpoint] = h
	}
	for i := range members {
		m := &members[i]
		// Healthy when every client URL answered the check; the first failure says why not.
		m.Healthy = len(m.ClientURLs) > 0
		if !m.Healthy {
			m.HealthError = "not started (no client URLs)"
		}
		for _, u := range m.ClientURLs {
			h, ok := byEndpoint[u]
			if ok && h.Health {
				continue
			}
			if m.Healthy {
				m.HealthError = "no health result for " + u
				if ok {
					m.HealthError = truncate(h.Error)
				}
			}
			m.Healthy = false
		}
	}
	return members, answeredBy, nil
}

// Removal is what Remove did, or what PlanRemove says it would do.
type Removal struct {
	Node string
	// Member is the node's member. Zero with NoMember.
	Member Member
	// NoMember: the node has no etcd member (removed before, or it never had one), so there is
	// nothing to do.
	NoMember bool
	// Remaining are the members after the removal, with their health.
	Remaining []Member
}

func (r Removal) String() string {
	if r.NoMember {
		return fmt.Sprintf("node %s has no etcd member (already removed?): nothing to remove; members: %s", r.Node, listMembers(r.Remaining))
	}
	return fmt.Sprintf("etcd member %s of node %s; remaining: %s", r.Member.IDString(), r.Node, listMembers(r.Remaining))
}

// RefusedError is returned when removing a node's member would break etcd or cannot be done
// safely from here. It names every member and its health.
type RefusedError struct {
	Node    string
	Reason  string
	Members []Member
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("refusing to remove the etcd member of node %s: %s; members: %s", e.Node, e.Reason, listMembers(e.Members))
}

// PlanRemove says what Remove(node) would do, and refuses as Remove does, without changing
// anything: for `apply` to say what it changes before it does it.
//
// The rule: a removal must leave a majority of the remaining voting members healthy, because
// etcd needs a majority of its voting members to accept a write, and the removed member no
// longer counts. So it refuses to remove
//   - the last member, or the last voting member;
//   - a voting member when the healthy voting members left would be fewer than a majority of
//     the voting members left (3 members with one down: removing a healthy one leaves one
//     healthy of two, no quorum; removing the down one leaves two of two);
//   - the member etcdctl talks to (removing it would cut the removal off; the runner must run
//     on another control plane).
//
// Learners do not vote, so removing one never costs quorum. A node without a member is no
// error: Removal.NoMember says so.
func (c *Client) PlanRemove(ctx context.Context, node string) (Removal, error) {
	members, answeredBy, err := c.members(ctx)
	if err != nil {
		return Removal{Node: node}, err
	}
	return planRemove(members, answeredBy, node)
}

// Remove removes node's etcd member after PlanRemove's checks. A member that disappears between
// the check and the removal counts as removed before (Removal.NoMember).
func (c *Client) Remove(ctx context.Context, node string) (Removal, error) {
	r, err := c.PlanRemove(ctx, node)
	if err != nil || r.NoMember {
		return r, err
	}
	stdout, err := c.removeMember(ctx, r.Member)
	if errors.Is(err, errMemberNotFound) {
		return Removal{Node: node, NoMember: true, Remaining: r.Remaining}, nil
	}
	if err != nil {
		return r, fmt.Errorf("removing etcd member %s of node %s: %w", r.Member.IDString(), node, err)
	}
	after, _, err := ParseMemberList(stdout)
	if err != nil {
		return r, fmt.Errorf("removing etcd member %s of node %s: %w", r.Member.IDString(), node, err)
	}
	for _, m := range after {
		if m.ID == r.Member.ID {
			return r, fmt.Errorf("removing etcd member %s of node %s: etcd still lists it after the removal", r.Member.IDString(), node)
		}
	}
	return r, nil
}

// etcd refuses a reconfiguration while its leader has not been connected to a quorum of the
// remaining voting members for HealthInterval (5 s), for example right after a member
// restarted ("etcdserver: unhealthy cluster", strict reconfiguration check). That passes on its
// own; Remove retries it for a while.
const (
	unhealthyRetryFor      = 15 * time.Second
	unhealthyRetryInterval = time.Second
)

var errMemberNotFound = errors.New("member not found")

func (c *Client) removeMember(ctx context.Context, m Member) ([]byte, error) {
	deadline := time.Now().Add(unhealthyRetryFor)
	for {
		stdout, stderr, err := c.runner.Run(ctx, "member", "remove", m.IDString(), "-w", "json")
		var exit *ExitError
		if !errors.As(err, &exit) {
			return stdout, err
		}
		switch {
		case strings.Contains(string(stderr), "etcdserver: member not found"):
			return nil, errMemberNotFound
		case strings.Contains(string(stderr), "etcdserver: unhealthy cluster") && time.Now().Before(deadline):
		default:
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (etcd refused while its leader had not been connected to enough members for 5 s)", err)
		case <-time.After(unhealthyRetryInterval):
		}
	}
}

func planRemove(members []Member, answeredBy uint64, node string) (Removal, error) {
	refuse := func(reason string) (Removal, error) {
		return Removal{Node: node}, &RefusedError{Node: node, Reason: reason, Members: members}
	}
	var target *Member
	var remaining []Member
	for i := range members {
		if members[i].Name == node {
			target = &members[i]
			continue
		}
		remaining = append(remaining, members[i])
	}
	if target == nil {
		return Removal{Node: node, NoMember: true, Remaining: members}, nil
	}
	if len(members) == 1 {
		return refuse("it is the last member: removing it would delete the cluster's state")
	}
	if target.ID == answeredBy {
		return refuse("etcdctl runs against this very member; run it on another control plane")
	}
	if !target.IsLearner {
		voters, healthy := 0, 0
		for _, m := range remaining {
			if m.IsLearner {
				continue
			}
			voters++
			if m.Healthy {
				healthy++
			}
		}
		if voters == 0 {
			return refuse("it is the last voting member")
		}
		if need := voters/2 + 1; healthy < need {
			return refuse(fmt.Sprintf("after the removal %d of the %d remaining voting members would be healthy, and etcd needs %d for quorum", healthy, voters, need))
		}
	}
	return Removal{Node: node, Member: *target, Remaining: remaining}, nil
}

// truncate bounds etcdctl's error texts in messages.
func truncate(s string) string {
	const limit = 256
	if len(s) > limit {
		return s[:limit] + "…"
	}
	return s
}

func listMembers(members []Member) string {
	if len(members) == 0 {
		return "none"
	}
	s := make([]string, len(members))
	for i, m := range members {
		s[i] = m.String()
	}
	return strings.Join(s, ", ")
}

func sortMembers(members []Member) {
	sort.Slice(members, func(i, j int) bool {
		if members[i].Name != members[j].Name {
			return members[i].Name < members[j].Name
		}
		return members[i].ID < members[j].ID
	})
}
