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

	"github.com/openconstellation/constellation/internal/retry"
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
	// Retry paces the runs of etcdctl that failed transiently (Transient: a leader election,
	// a request that timed out, the API server's exec connection reset); RetryFor bounds the
	// retries of one run. Set by New; tests change them.
	Retry    retry.Policy
	RetryFor time.Duration
}

// DefaultRetry and DefaultRetryFor are a Client's retries: an etcd leader election after a
// membership change takes a second or two, and etcd's strict reconfiguration check refuses
// for 5 s after a member (re)connected.
var (
	DefaultRetry    = retry.Policy{Initial: 500 * time.Millisecond, Max: 5 * time.Second, Factor: 2, Jitter: 0.2}
	DefaultRetryFor = time.Minute
)

// transientEtcdErrors are etcd's errors that pass by themselves, as etcdctl prints them: a
// leader that changed or is being elected, a request that timed out (often because its leader
// went away: the member just removed may have been the leader), the strict reconfiguration
// check right after a member (re)connected, and etcdctl's own command timeout. etcdctl is a
// subprocess: its stderr is all there is to classify by. The texts are etcd's error
// descriptions (go.etcd.io/etcd/api/v3/v3rpc/rpctypes, v3.6), which etcdctl prints after
// "Error: ".
var transientEtcdErrors = []string{
	"etcdserver: leader changed", "etcdserver: no leader",
	"etcdserver: request timed out", // the prefix of every "request timed out" error
	"etcdserver: unhealthy cluster", "etcdserver: too many requests",
	context.DeadlineExceeded.Error(),
}

// Errors of etcd (rpctypes) that a removal tells apart.
const (
	etcdMemberNotFound = "etcdserver: member not found"
	etcdUnhealthy      = "etcdserver: unhealthy cluster"
)

// Transient reports whether an etcdctl run that failed with err may succeed if run again:
// etcd said so (transientEtcdErrors), or reaching etcdctl failed transiently (retry.Transient:
// the API server's exec connection refused or reset, a 5xx).
func Transient(err error) bool {
	var exit *ExitError
	if errors.As(err, &exit) {
		for _, t := range transientEtcdErrors {
			if strings.Contains(exit.Stderr, t) {
				return true
			}
		}
		return false
	}
	return retry.Transient(err)
}

// run runs etcdctl, again while it fails transiently (within RetryFor). final, when set,
// decides that a failed run's output is an answer anyway (endpoint health exits 1 after
// printing every result); the run's own error is returned then.
func (c *Client) run(ctx context.Context, final func(stdout []byte, err error) bool, args ...string) (stdout, stderr []byte, err error) {
	ctx, cancel := context.WithTimeout(ctx, c.RetryFor)
	defer cancel()
	var runErr error
	err = retry.Do(ctx, c.Retry, Transient, func(ctx context.Context) error {
		stdout, stderr, runErr = c.runner.Run(ctx, args...)
		if runErr == nil || (final != nil && final(stdout, runErr)) {
			return nil
		}
		return runErr
	})
	if err != nil {
		return stdout, stderr, err
	}
	return stdout, stderr, runErr
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
	return &Client{runner: runner, healthTimeout: healthTimeout, Retry: DefaultRetry, RetryFor: DefaultRetryFor}
}

// Members lists the cluster's members with their health, sorted by name and ID.
func (c *Client) Members(ctx context.Context) ([]Member, error) {
	members, _, err := c.members(ctx)
	return members, err
}

func (c *Client) members(ctx context.Context) ([]Member, uint64, error) {
	stdout, _, err := c.run(ctx, nil, "member", "list", "-w", "json")
	if err != nil {
		return nil, 0, fmt.Errorf("listing etcd members: %w", err)
	}
	members, answeredBy, err := ParseMemberList(stdout)
	if err != nil {
		return nil, 0, err
	}
	// etcdctl exits 1 when an endpoint is unhealthy, after printing every result.
	var exit *ExitError
	stdout, _, err = c.run(ctx, func(stdout []byte, err error) bool {
		return errors.As(err, &exit) && exit.Code == 1 && len(stdout) > 0
	}, "endpoint", "health", "--cluster", "-w", "json", "--command-timeout="+c.healthTimeout.String())
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

// QuorumWhileDown reports whether etcd keeps its quorum while the member to remove is down
// and still a voting member: whether its node may be shut down before the removal. A
// majority of all voters, the member counted, must be healthy among the remaining ones. Three
// healthy members allow it (2 of 3); two do not (1 of 2): there the member must go first.
func (r Removal) QuorumWhileDown() bool {
	if r.NoMember {
		return true
	}
	voters, healthy := 0, 0
	for _, m := range r.Remaining {
		if m.IsLearner {
			continue
		}
		voters++
		if m.Healthy {
			healthy++
		}
	}
	if !r.Member.IsLearner {
		voters++
	}
	return healthy >= voters/2+1
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
	// Unhealthy: refused only because too few of the remaining members are healthy now,
	// which a member that is restarting or catching up changes by itself.
	Unhealthy bool
}

// Transient makes a refusal for health retryable (retry.Transient): right after a membership
// change or a restart a member may fail a health check for a few seconds.
func (e *RefusedError) Transient() bool { return e.Unhealthy }

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

var errMemberNotFound = errors.New("member not found")

// removeMember runs member remove, again while etcd refuses for a passing reason (Transient):
// a reconfiguration is refused while the leader has not been connected to a quorum of the
// remaining voting members for 5 s ("etcdserver: unhealthy cluster", strict reconfiguration
// check), for example right after a member restarted. A removal whose answer was lost (a
// timeout, a reset exec connection) may have been applied: the next attempt then finds no
// member ("member not found"), which counts as removed.
func (c *Client) removeMember(ctx context.Context, m Member) ([]byte, error) {
	stdout, stderr, err := c.run(ctx, func(_ []byte, err error) bool {
		var exit *ExitError
		return errors.As(err, &exit) && strings.Contains(exit.Stderr, etcdMemberNotFound)
	}, "member", "remove", m.IDString(), "-w", "json")
	var exit *ExitError
	if errors.As(err, &exit) && strings.Contains(exit.Stderr, etcdMemberNotFound) {
		return nil, errMemberNotFound
	}
	if err != nil && strings.Contains(string(stderr), etcdUnhealthy) {
		return nil, fmt.Errorf("%w (etcd refused while its leader had not been connected to enough members for 5 s)", err)
	}
	return stdout, err
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
			r, err := refuse(fmt.Sprintf("after the removal %d of the %d remaining voting members would be healthy, and etcd needs %d for quorum", healthy, voters, need))
			err.(*RefusedError).Unhealthy = true
			return r, err
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
