// Package azuree2e runs the Azure provider against Azure itself: a user with an account runs
// it (docs/azure.md "Live test"); this project never did. It stores the node OS image, creates
// a cluster of one confidential VM through the provider the CLI uses, checks what Azure made of
// it, reboots the node, and removes everything again, even when a step fails.
//
//	AZURE_SUBSCRIPTION_ID=... AZURE_LOCATION=westeurope CONSTELLATION_VM_IMAGE=_output/vm-image \
//	  go test -tags azuree2e -count=1 -timeout 60m -v ./test/azuree2e/
package azuree2e
