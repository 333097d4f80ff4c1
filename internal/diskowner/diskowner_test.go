package diskowner_test

import (
	"context"
	"strings"
	"testing"

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
