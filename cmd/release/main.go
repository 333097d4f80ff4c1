// Command release makes signed Constellation releases: `release keygen` makes the release key
// once, `release create` lays out, measures and signs a release into a release source
// (internal/release/publish, docs/releases.md). `make release-key` and `make release` run it.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/openconstellation/constellation/internal/release/publish"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := publish.NewCommand().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}
