package config

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/provider/local"
)

// The configuration's tests check the local provider's rules as the CLI applies them: the
// provider catalog registers them in the CLI (internal/provider/catalog).
func init() { RegisterProvider("local", local.ConfigRules{}) }

// A configuration whose provider has no rules in the program is refused, naming the
// provider: half a check would pass configurations the provider cannot run.
func TestValidateRefusesProviderWithoutRules(t *testing.T) {
	c := validConfig()
	providersMu.Lock()
	saved := providers
	providers = map[string]ProviderRules{}
	providersMu.Unlock()
	t.Cleanup(func() {
		providersMu.Lock()
		providers = saved
		providersMu.Unlock()
	})
	err := c.Validate()
	require.Error(t, err)
	assert.Contains(t, err.Error(), `provider.local: this program has no rules for provider "local" (registered: none)`)

	// A file is refused as it is parsed: its block names no provider the program knows.
	_, err = Parse([]byte(validYAML))
	assert.ErrorContains(t, err, "provider.local: unknown field (known: none)")
}
