// Package instances is the services' side of the provider catalog: how the cluster's
// services list their platform's instances (the join service: internal/metadata) and reach its
// volumes' storage (the volume driver's controller: csidriver.Backing), by the node platform's
// name (their --platform). Services depend on those interfaces only; this file is the one
// place that names each platform's clients. It is a package of its own so the
// services link no more of a provider than its metadata client (catalog links the CLI's
// host halves, nodes the node program).
//
// A new provider adds one line to builtins here and one to nodes (docs/providers.md).
package instances

import (
	"fmt"
	"slices"
	"strings"

	"github.com/openconstellation/constellation/internal/csidriver"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider/azure/azuremeta"
	"github.com/openconstellation/constellation/internal/provider/azure/azurevolumes"
	"github.com/openconstellation/constellation/internal/provider/local/metadataclient"
	"github.com/openconstellation/constellation/internal/provider/local/volumeclient"
)

// Default is the platform services assume when none is named: the local provider's.
const Default = "local"

// Platform is how services reach one platform's metadata.
type Platform struct {
	// DefaultURL is where the platform serves metadata to its nodes.
	DefaultURL string
	// Open returns a client of the platform's metadata service at url. It checks url
	// without contacting the service.
	Open func(url string) (metadata.Lister, error)
	// Volumes returns the platform's storage for the volume driver, found through its
	// metadata service at url, without contacting it.
	Volumes func(url string) (csidriver.Backing, error)
}

// builtins are the platforms services can run on: one line each.
var builtins = map[string]Platform{
	"local": localPlatform,
	// The QEMU provider's machines read the same metadata service, on the same network, which
	// plugs volumes into them.
	"qemu": localPlatform,
	// Azure: the VM's IMDS names its cluster; Resource Manager lists it and keeps its volumes'
	// disks (the VM's managed identity).
	"azure": {
		DefaultURL: azuremeta.IMDSURL,
		Open:       func(url string) (metadata.Lister, error) { return azuremeta.NewClusterLister(url), nil },
		Volumes:    func(url string) (csidriver.Backing, error) { return azurevolumes.NewClusterBacking(url), nil },
	},
}

// localPlatform is the local provider's metadata service, which keeps the volumes too.
var localPlatform = Platform{
	DefaultURL: metadataclient.DefaultURL,
	Open:       func(url string) (metadata.Lister, error) { return metadataclient.New(url, nil) },
	Volumes:    func(url string) (csidriver.Backing, error) { return volumeclient.New(url), nil },
}

// Lookup returns the platform named name ("" is Default).
func Lookup(name string) (Platform, error) {
	if name == "" {
		name = Default
	}
	p, ok := builtins[name]
	if !ok {
		names := make([]string, 0, len(builtins))
		for n := range builtins {
			names = append(names, n)
		}
		slices.Sort(names)
		return Platform{}, fmt.Errorf("platform %q is not supported (supported: %s)", name, strings.Join(names, ", "))
	}
	return p, nil
}

// Open returns a client of the metadata service of platform name at url; an empty url is
// the platform's DefaultURL.
func Open(name, url string) (metadata.Lister, error) {
	p, err := Lookup(name)
	if err != nil {
		return nil, err
	}
	if url == "" {
		url = p.DefaultURL
	}
	return p.Open(url)
}
