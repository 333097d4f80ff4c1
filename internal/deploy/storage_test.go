package deploy

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/openconstellation/constellation/internal/volumes"
)

// TestStorageConfig: the provisioner keeps every node's volumes in volumes.Dir, its helper pods
// run volumehelper from the services image (never pulled), as root with only the capabilities
// that remove another user's files, and the StorageClass is not the default one.
func TestStorageConfig(t *testing.T) {
	const image = "localhost/constellation/services:abc"
	cm, err := storageConfigMap(params{image: image})
	require.NoError(t, err)

	var cfg provisionerConfig
	require.NoError(t, json.Unmarshal([]byte(cm.Data["config.json"]), &cfg))
	assert.Equal(t, []nodePath{{Node: "DEFAULT_PATH_FOR_NON_LISTED_NODES", Paths: []string{volumes.Dir}}}, cfg.NodePathMap)
	assert.Equal(t, "/usr/local/bin/volumehelper", cfg.SetupCommand)
	assert.Equal(t, "/usr/local/bin/volumehelper", cfg.TeardownCommand)

	var helper corev1.Pod
	require.NoError(t, yaml.UnmarshalStrict([]byte(cm.Data["helperPod.yaml"]), &helper))
	require.Len(t, helper.Spec.Containers, 1)
	c := helper.Spec.Containers[0]
	assert.Equal(t, image, c.Image)
	assert.Equal(t, corev1.PullNever, c.ImagePullPolicy)
	assert.Equal(t, []corev1.Capability{"ALL"}, c.SecurityContext.Capabilities.Drop)
	assert.Equal(t, []corev1.Capability{"DAC_OVERRIDE", "FOWNER"}, c.SecurityContext.Capabilities.Add)
	assert.False(t, *c.SecurityContext.AllowPrivilegeEscalation)

	sc := storageClass()
	assert.NotContains(t, sc.Annotations, DefaultClassAnnotation, "an explicit node-local class, not the default")
	assert.Equal(t, StorageProvisionerName, *sc.Provisioner)

	d := storageDeployment(params{image: image})
	pc := d.Spec.Template.Spec.Containers[0]
	assert.Equal(t, image, *pc.Image)
	assert.Contains(t, pc.Args, StorageProvisionerName)
	assert.True(t, *pc.SecurityContext.RunAsNonRoot)
}
