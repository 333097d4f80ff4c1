// Package nodes is the node side of the provider catalog: the node platforms the node
// program (internal/bootstrapper/boot) runs on, by name, which cmd/bootstrapper picks with
// --platform. A node platform is a provider's node half: a boot.Platform. It is a package of
// its own, apart from the CLI's catalog, so the CLI does not link the node program and the
// node does not link the CLI's host halves.
//
// A new provider adds one line to builtins (docs/providers.md).
package nodes

import (
	"fmt"
	"slices"
	"strings"

	"github.com/openconstellation/constellation/internal/bootstrapper/boot"
	"github.com/openconstellation/constellation/internal/provider/azure/azurenode"
	"github.com/openconstellation/constellation/internal/provider/local/nodeboot"
	"github.com/openconstellation/constellation/internal/provider/qemu/vmnode"
)

// Default is the node platform the bootstrapper runs on when none is named: the local
// provider's sandbox, whose nodes start the bootstrapper without --platform.
const Default = nodeboot.Name

// New returns a node platform for the bootstrapper's flags.
type New func(boot.PlatformConfig) (boot.Platform, error)

// builtins are the node platforms: one line each.
var builtins = map[string]New{
	nodeboot.Name:  nodeboot.New,
	vmnode.Name:    vmnode.New,
	azurenode.Name: azurenode.New,
}

// Lookup returns the node platform named name ("" is Default).
func Lookup(name string) (New, error) {
	if name == "" {
		name = Default
	}
	n, ok := builtins[name]
	if !ok {
		return nil, fmt.Errorf("node platform %q is not supported (supported: %s)", name, strings.Join(Names(), ", "))
	}
	return n, nil
}

// Names are the node platforms' names, sorted.
func Names() []string {
	names := make([]string, 0, len(builtins))
	for n := range builtins {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
