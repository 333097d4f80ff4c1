package cli

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/openconstellation/constellation/internal/clusterrecord"
	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/registries"
)

// TestSyncRegistryMirrors: apply records changed mirrors (and says so), leaves unchanged ones
// alone, and refuses to go on over a record it cannot read.
func TestSyncRegistryMirrors(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset()
	conf := &config.Config{}
	recorded := func() string {
		cm, err := client.CoreV1().ConfigMaps(clusterrecord.Namespace).Get(ctx, clusterrecord.RegistriesConfigMapName, metav1.GetOptions{})
		require.NoError(t, err)
		return cm.Data[clusterrecord.RegistryMirrorsKey]
	}
	var out bytes.Buffer

	changed, err := syncRegistryMirrors(ctx, &out, client, conf)
	require.NoError(t, err)
	assert.False(t, changed, "none configured, none recorded (a cluster from before mirrors)")

	conf.RegistryMirrors = registries.Mirrors{"docker.io": {"https://mirror.gcr.io"}}
	changed, err = syncRegistryMirrors(ctx, &out, client, conf)
	require.NoError(t, err)
	assert.True(t, changed)
	assert.JSONEq(t, `{"docker.io":["https://mirror.gcr.io"]}`, recorded())
	assert.Contains(t, out.String(), "registry mirrors recorded (docker.io): joining nodes use them now, running nodes from their next reboot")

	changed, err = syncRegistryMirrors(ctx, &out, client, conf)
	require.NoError(t, err)
	assert.False(t, changed, "as configured")

	conf.RegistryMirrors = nil
	changed, err = syncRegistryMirrors(ctx, &out, client, conf)
	require.NoError(t, err)
	assert.True(t, changed, "mirrors removed")
	assert.JSONEq(t, `{}`, recorded())

	cm, err := client.CoreV1().ConfigMaps(clusterrecord.Namespace).Get(ctx, clusterrecord.RegistriesConfigMapName, metav1.GetOptions{})
	require.NoError(t, err)
	cm.Data[clusterrecord.RegistryMirrorsKey] = `{"docker.io": ["ftp://x"]}`
	_, err = client.CoreV1().ConfigMaps(clusterrecord.Namespace).Update(ctx, cm, metav1.UpdateOptions{})
	require.NoError(t, err)
	_, err = syncRegistryMirrors(ctx, &out, client, conf)
	assert.ErrorContains(t, err, "ConfigMap kube-system/constellation-registries")
}
