package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/kubeversion"
)

func TestSelected(t *testing.T) {
	all, err := selected("")
	require.NoError(t, err)
	assert.Equal(t, kubeversion.Releases(), all)
	def, err := selected("default")
	require.NoError(t, err)
	require.Len(t, def, 1)
	assert.Equal(t, kubeversion.Default, def[0].Kubernetes)
	two, err := selected("v1.34.4, v1.35.4")
	require.NoError(t, err)
	assert.Len(t, two, 2)
	_, err = selected("v1.20.0")
	assert.ErrorContains(t, err, "not supported")
}
