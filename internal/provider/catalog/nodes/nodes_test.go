package nodes_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/bootstrapper/boot"
	"github.com/openconstellation/constellation/internal/provider/catalog"
	"github.com/openconstellation/constellation/internal/provider/catalog/instances"
	"github.com/openconstellation/constellation/internal/provider/catalog/nodes"
)

// Every node platform is a provider of the CLI's catalog, and its services find its metadata
// client under the same name (deploy passes the node platform's name as --platform).
func TestNodePlatformsAreProviders(t *testing.T) {
	require.NotEmpty(t, nodes.Names())
	for _, name := range nodes.Names() {
		_, err := catalog.Lookup(name)
		assert.NoError(t, err, "CLI provider %q", name)
		_, err = instances.Lookup(name)
		assert.NoError(t, err, "services' metadata client of %q", name)
	}
}

func TestLookup(t *testing.T) {
	testCases := map[string]struct {
		name    string
		wantErr string
	}{
		"default": {name: ""},
		"local":   {name: "local"},
		"unknown": {name: "qemu-nope", wantErr: `node platform "qemu-nope" is not supported (supported: azure, local, qemu)`},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			newPlatform, err := nodes.Lookup(tc.name)
			if tc.wantErr != "" {
				assert.EqualError(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			p, err := newPlatform(boot.PlatformConfig{NodeDir: t.TempDir(), ImageDir: t.TempDir()})
			require.NoError(t, err)
			assert.Equal(t, nodes.Default, p.Name())
			// The platform's facts are what deploy accepts.
			assert.NoError(t, p.Services().Validate())
			assert.Equal(t, p.Name(), p.Services().Name)
		})
	}
}
