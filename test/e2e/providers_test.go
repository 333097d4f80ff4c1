package e2e

// The tests read configurations as the CLI does: checked by its providers' rules, which the
// provider catalog registers (config.Validate refuses a provider without rules).
import _ "github.com/openconstellation/constellation/internal/provider/catalog"
