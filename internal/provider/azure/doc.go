// Package azure is the Azure provider's host half: it creates a cluster's resources through
// Azure Resource Manager with the Azure SDK for Go (armcompute, armnetwork, armresources,
// armmsi, armauthorization), one confidential VM (AMD SEV-SNP or Intel TDX) per node, and
// removes them again. docs/azure.md says what each resource is for, what the hypervisor can
// and cannot see, and what of this was never run against Azure.
//
// The code is in three layers, each tested on its own: what to create is decided by pure
// functions of the cluster's layout (requests.go, pinned by golden files); the calls, their
// long-running operations and their errors go through the SDK's clients (clients.go,
// ensure.go, errors.go), which the tests point at the SDK's own fake servers; the order of the
// calls and what a rerun adopts is infra.go.
package azure
