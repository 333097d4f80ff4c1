package e2e

// The tests read configurations as the CLI does: checked by its providers' rules, which the
// provider catalog registers (config.Parse refuses a provider block no registered provider
// names, and config.Validate a provider without rules).
import _ "github.com/openconstellation/constellation/internal/provider/catalog"
