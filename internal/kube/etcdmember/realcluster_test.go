package etcdmember_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/kube/etcdmember"
)

func names(members []etcdmember.Member) []string {
	var n []string
	for _, m := range members {
		n = append(n, m.String())
	}
	return n
}

// TestRealCluster scales a real three-member etcd cluster down with the real etcdctl, each step
// on the state the previous one left.
func TestRealCluster(t *testing.T) {
	c := startEtcdCluster(t, 3)
	// etcdctl talks to m0, the member that stays throughout (as the CLI picks a control plane
	// that stays).
	client := etcdmember.New(c.runner(0), time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	members, err := client.Members(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"m0 (healthy)", "m1 (healthy)", "m2 (healthy)"}, names(members))
	for i, m := range members {
		assert.NotZero(t, m.ID)
		assert.False(t, m.IsLearner)
		assert.Equal(t, []string{c.members[i].clientURL}, m.ClientURLs)
		assert.Equal(t, []string{c.members[i].peerURL}, m.PeerURLs)
	}

	// m2 crashes: removing the healthy m1 would leave m0 alone of {m0, m2}, no quorum.
	c.kill(2)
	_, err = client.Remove(ctx, "m1")
	var refused *etcdmember.RefusedError
	require.ErrorAs(t, err, &refused)
	t.Log(err)
	assert.Contains(t, err.Error(), "after the removal 1 of the 2 remaining voting members would be healthy, and etcd needs 2 for quorum")
	assert.Contains(t, err.Error(), "m0 (healthy), m1 (healthy), m2 (unhealthy: ")
	members, err = client.Members(ctx)
	require.NoError(t, err)
	assert.Len(t, members, 3, "nothing removed")

	// m2 is back: removing it, healthy, leaves two healthy members.
	c.restart(2)
	c.waitHealthy(0)
	plan, err := client.PlanRemove(ctx, "m2")
	require.NoError(t, err)
	assert.Equal(t, "m2", plan.Member.Name)
	removal, err := client.Remove(ctx, "m2")
	require.NoError(t, err)
	assert.Equal(t, plan.Member.ID, removal.Member.ID)
	assert.Equal(t, []string{"m0 (healthy)", "m1 (healthy)"}, names(removal.Remaining))
	members, err = client.Members(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"m0 (healthy)", "m1 (healthy)"}, names(members), "3 → 2, still healthy")
	// The cluster still takes writes (needs a quorum of the two).
	_, _, err = c.runner(0).Run(ctx, "put", "scaled", "down")
	require.NoError(t, err)
	out, _, err := c.runner(1).Run(ctx, "get", "scaled", "--print-value-only")
	require.NoError(t, err)
	assert.Equal(t, "down\n", string(out))

	// Removed already: nothing to do, and it says so.
	removal, err = client.Remove(ctx, "m2")
	require.NoError(t, err)
	assert.True(t, removal.NoMember)
	assert.Contains(t, removal.String(), "node m2 has no etcd member (already removed?)")

	// 2 → 1 leaves m0 healthy alone: a quorum of one.
	_, err = client.Remove(ctx, "m1")
	require.NoError(t, err)
	members, err = client.Members(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"m0 (healthy)"}, names(members))

	// The last member stays.
	_, err = client.Remove(ctx, "m0")
	require.ErrorAs(t, err, &refused)
	assert.Contains(t, err.Error(), "it is the last member")
	members, err = client.Members(ctx)
	require.NoError(t, err)
	assert.Len(t, members, 1)
}
