package catalog

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/provider/fake"
	"github.com/openconstellation/constellation/internal/state"
)

func TestBuiltins(t *testing.T) {
	p, err := Lookup(state.ProviderLocal)
	require.NoError(t, err)
	assert.Equal(t, "local", p.Name())
	assert.Equal(t, state.ProviderLocal, p.Name(), "the state file names providers as the configuration does")
	assert.Contains(t, config.RegisteredProviders(), "local", "its configuration rules are registered with it")

	q, err := Lookup("qemu")
	require.NoError(t, err)
	assert.Equal(t, "qemu", q.Name())
	assert.Contains(t, config.RegisteredProviders(), "qemu")

	_, err = Lookup("gcp")
	assert.ErrorContains(t, err, `provider "gcp" is not supported by this CLI (supported: azure, local, qemu)`)
}

// TestRegister: one call makes a provider known to the catalog, the configuration and the
// state file.
func TestRegister(t *testing.T) {
	Register(fake.New())
	p, err := Lookup(fake.Name)
	require.NoError(t, err)
	assert.Equal(t, fake.Name, p.Name())
	assert.Contains(t, config.RegisteredProviders(), fake.Name)
	var names []string
	for _, p := range All() {
		names = append(names, p.Name())
	}
	assert.Equal(t, []string{"azure", fake.Name, "local", "qemu"}, names)
}
