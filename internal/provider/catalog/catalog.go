// Package catalog is the list of the providers this CLI supports: the CLI looks a provider up
// by the name its configuration block (provider.<name>) or its state file gives.
// Registering a provider here also registers its configuration rules with internal/config
// (config.RegisterProvider), so that a configuration is checked by its provider's rules and
// a state file may name it (internal/state).
//
// A new provider adds its folder below internal/provider and one line to builtins
// (docs/providers.md).
package catalog

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/provider/azure"
	localplatform "github.com/openconstellation/constellation/internal/provider/local/platform"
	"github.com/openconstellation/constellation/internal/provider/qemu"
)

// builtins are the providers of this CLI: one line each.
var builtins = []provider.Platform{
	localplatform.Platform{},
	qemu.Platform{},
	azure.Platform{},
}

var (
	mu        sync.RWMutex
	platforms = map[string]provider.Platform{}
)

func init() {
	for _, p := range builtins {
		Register(p)
	}
}

// Register adds a provider (tests add fakes with it). A later registration of a name
// replaces the earlier one.
func Register(p provider.Platform) {
	mu.Lock()
	defer mu.Unlock()
	platforms[p.Name()] = p
	config.RegisterProvider(p.Name(), p.ConfigRules())
}

// Lookup returns the provider named name.
func Lookup(name string) (provider.Platform, error) {
	mu.RLock()
	defer mu.RUnlock()
	p, ok := platforms[name]
	if !ok {
		return nil, fmt.Errorf("provider %q is not supported by this CLI (supported: %s)", name, strings.Join(namesLocked(), ", "))
	}
	return p, nil
}

// All returns every registered provider, by name.
func All() []provider.Platform {
	mu.RLock()
	defer mu.RUnlock()
	out := make([]provider.Platform, 0, len(platforms))
	for _, n := range namesLocked() {
		out = append(out, platforms[n])
	}
	return out
}

func namesLocked() []string {
	names := make([]string, 0, len(platforms))
	for n := range platforms {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
