// Command constellation is the Constellation CLI.
package main

import (
	"os"

	"github.com/openconstellation/constellation/internal/cli"
)

func main() {
	if err := cli.NewRootCmd().Execute(); err != nil {
		os.Exit(1)
	}
}
