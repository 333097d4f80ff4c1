package config

import "github.com/openconstellation/constellation/internal/provider/local"

// The configuration's tests check the local provider's rules as the CLI applies them: the
// provider catalog registers them in the CLI (internal/provider/catalog).
func init() { RegisterProvider(ProviderLocal, local.ConfigRules{}) }
