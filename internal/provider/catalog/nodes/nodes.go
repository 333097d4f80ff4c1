// Package nodes is the node side of the provider catalog: the node platforms the node
// program (internal/bootstrapper/boot) runs on, by name, which cmd/bootstrapper picks with
// --platform. A node platform is a provider's node half: a boot.Platform. It is a package of
// its own, apart from the CLI's catalog, so the CLI does not link the node program and the
// node does not link the CLI's host halves.
//
// A new provider adds one line to builtins (docs/providers.md), and one to detectors if the
// node OS image boots on its machines.
package nodes

import (
	"fmt"
	"slices"
	"strings"

	"github.com/openconstellation/constellation/internal/bootstrapper/boot"
	"github.com/openconstellation/constellation/internal/dmi"
	"github.com/openconstellation/constellation/internal/provider/azure/azurenode"
	"github.com/openconstellation/constellation/internal/provider/local/nodeboot"
	"github.com/openconstellation/constellation/internal/provider/qemu/vmnode"
)

// Default is the node platform the bootstrapper runs on when none is named: the local
// provider's sandbox, whose nodes start the bootstrapper without --platform.
const Default = nodeboot.Name

// Auto is the --platform of the node OS image (docs/vm-image.md "Units"): one image boots on
// every provider's machines, and tells which one it is on by the firmware's identity (Detect).
const Auto = "auto"

// New returns a node platform for the bootstrapper's flags.
type New func(boot.PlatformConfig) (boot.Platform, error)

// builtins are the node platforms: one line each.
var builtins = map[string]New{
	nodeboot.Name:  nodeboot.New,
	vmnode.Name:    vmnode.New,
	azurenode.Name: azurenode.New,
}

// detectors tell the platforms the node OS image boots on by their firmware identity, in the
// order they are asked. The local sandbox is not among them: its nodes run no firmware.
var detectors = []struct {
	name   string
	detect func(dmi.Info) bool
}{
	{azurenode.Name, azurenode.Detect},
	{vmnode.Name, vmnode.Detect},
}

// Detect names the platform of the machine whose firmware identity info is. A machine no
// platform claims is an error that says what its firmware said: --platform names it then.
func Detect(info dmi.Info) (string, error) {
	for _, d := range detectors {
		if d.detect(info) {
			return d.name, nil
		}
	}
	return "", fmt.Errorf("no node platform claims this machine (%s): name it with --platform (supported: %s)", info, strings.Join(Names(), ", "))
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
