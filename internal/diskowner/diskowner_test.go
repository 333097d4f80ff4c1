package diskowner_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/openconstellation/constellation/internal/diskowner"
)

const disk = "3F2504E0-4F89-11D3-9A0C-0305E82C3301"

func TestStore(t *testing.T) {
	ctx := context.Background()
	testCases := map[string]struct {
		existing  map[string]string // data of the record of disk, if any
		claimBy   string
		wantOwner string
		wantErr   string
	}{
		"first claim wins":                 {claimBy: "worker-0", wantOwner: "worker-0"},
		"same node again":                  {existing: map[string]string{"node": "worker-0"}, claimBy: "worker-0", wantOwner: "worker-0"},
		"another node's disk":              {existing: map[string]string{"node": "worker-0"}, claimBy: "worker-1", wantOwner: "worker-0"},
		"record without a node fails shut": {existing: map[string]string{}, claimBy: "worker-1", wantErr: "names no valid node"},
		"invalid node name":                {claimBy: "Worker_0", wantErr: "node name"},
		"huge node name is truncated":      {claimBy: strings.Repeat("a", 1<<20), wantErr: "(1048576 bytes)"},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			client := fake.NewClientset()
			require.NoError(t, diskowner.EnsureNamespace(ctx, client))
			require.NoError(t, diskowner.EnsureNamespace(ctx, client), "idempotent")
			if tc.existing != nil {
				_, err := client.CoreV1().ConfigMaps(diskowner.Namespace).Create(ctx, &corev1.ConfigMap{
					ObjectMeta: metav1.ObjectMeta{Name: "disk-" + strings.ToLower(disk)}, Data: tc.existing,
				}, metav1.CreateOptions{})
				require.NoError(t, err)
			}
			store := diskowner.Store{Client: client}
			owner, err := store.Claim(ctx, disk, tc.claimBy)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				assert.Less(t, len(err.Error()), 1024)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.wantOwner, owner)
			owner, err = store.Owner(ctx, strings.ToLower(disk))
			require.NoError(t, err)
			assert.Equal(t, tc.wantOwner, owner)
			cm, err := client.CoreV1().ConfigMaps(diskowner.Namespace).Get(ctx, "disk-"+strings.ToLower(disk), metav1.GetOptions{})
			require.NoError(t, err)
			if tc.existing == nil {
				assert.True(t, *cm.Immutable)
			}
		})
	}
	t.Run("no record", func(t *testing.T) {
		_, err := diskowner.Store{Client: fake.NewClientset()}.Owner(ctx, disk)
		assert.ErrorIs(t, err, diskowner.ErrNoRecord)
	})
	t.Run("malformed UUID", func(t *testing.T) {
		_, err := diskowner.Store{Client: fake.NewClientset()}.Claim(ctx, "../../kube-system/x", "worker-0")
		assert.ErrorIs(t, err, diskowner.ErrMalformedUUID)
	})
}

// Records returns what Claim wrote, and only records the join service would honour: a
// record with a name or node it would refuse names nobody's disk.
func TestRecords(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset()
	require.NoError(t, diskowner.EnsureNamespace(ctx, client))
	store := diskowner.Store{Client: client}
	const other = "0d9e4a2c-5b1f-4c3e-8a7d-6f2e1b0c9a88"
	for uuid, node := range map[string]string{disk: "control-plane-0", other: "worker-0"} {
		_, err := store.Claim(ctx, uuid, node)
		require.NoError(t, err)
	}
	require.NoError(t, store.MarkRemoved(ctx, "worker-1", time.Now()))
	label := map[string]string{"app.kubernetes.io/component": diskowner.ComponentLabel}
	for name, data := range map[string]map[string]string{
		"disk-" + strings.Repeat("a", 8) + "-0000-0000-0000-000000000000": {"node": "Not_A_Node"},
		"disk-3F2504E0-4F89-11D3-9A0C-0305E82C3302":                       {"node": "worker-0"},
		"planted": {"node": "worker-0"},
	} {
		_, err := client.CoreV1().ConfigMaps(diskowner.Namespace).Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: label}, Data: data,
		}, metav1.CreateOptions{})
		require.NoError(t, err)
	}

	records, invalid, err := store.Records(ctx)
	require.NoError(t, err)
	var got []diskowner.Record
	for _, r := range records {
		got = append(got, diskowner.Record{Disk: r.Disk, Node: r.Node})
	}
	assert.Equal(t, []diskowner.Record{{Disk: other, Node: "worker-0"}, {Disk: strings.ToLower(disk), Node: "control-plane-0"}}, got,
		"ordered by disk, lower case, the removed-node record is not a disk record")
	assert.Len(t, invalid, 3)
	for _, err := range invalid {
		assert.Regexp(t, "not \"disk-\" and a lower-case UUID|names no valid node", err.Error())
	}
}
