// Command volumehelper creates and removes the directories of the default StorageClass's
// volumes on a node (internal/volumes): local-path-provisioner's helper pods run it.
package main

import (
	"fmt"
	"os"

	"github.com/openconstellation/constellation/internal/volumes"
)

func main() {
	if err := volumes.Helper(volumes.Dir, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "volumehelper: %v\n", err)
		os.Exit(1)
	}
}
