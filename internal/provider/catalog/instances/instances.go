// Package instances is the services' side of the provider catalog: how the cluster's
// services (the join service) list their platform's instances (internal/metadata), by the
// node platform's name (their --platform). Services depend on metadata.Lister only; this file
// is the one place that names each platform's client. It is a package of its own so the
// services link no more of a provider than its metadata client (catalog links the CLI's
// host halves, nodes the node program).
//
// A new provider adds one line to builtins here and one to nodes (docs/providers.md).
package instances

import (
	"fmt"
	"slices"
	"strings"

	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider/azure/azuremeta"
	"github.com/openconstellation/constellation/internal/provider/local/metadataclient"
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
}

// builtins are the platforms services can run on: one line each.
var builtins = map[string]Platform{
	"local": {DefaultURL: metadataclient.DefaultURL, Open: func(url string) (metadata.Lister, error) { return metadataclient.New(url, nil) }},
	// The QEMU provider's machines read the same metadata service, on the same network.
	"qemu": {DefaultURL: metadataclient.DefaultURL, Open: func(url string) (metadata.Lister, error) { return metadataclient.New(url, nil) }},
	// Azure: the VM's IMDS names its cluster; Resource Manager lists it (the nodes' identity).
	"azure": {DefaultURL: azuremeta.IMDSURL, Open: func(url string) (metadata.Lister, error) { return azuremeta.NewClusterLister(url), nil }},
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
