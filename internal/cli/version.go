package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"runtime"
	"runtime/debug"
	"slices"

	"github.com/spf13/cobra"

	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/provider/catalog"
)

// versionInfo is what `constellation version` prints.
type versionInfo struct {
	// Version is the module version of the binary ("(devel)" for a build from a checkout).
	Version string `json:"version"`
	// GoVersion is the Go toolchain the binary was built with.
	GoVersion string `json:"goVersion"`
	// Platform is GOOS/GOARCH.
	Platform string `json:"platform"`
	// Commit and Modified come from the VCS stamp, when the build has one.
	Commit   string `json:"commit,omitempty"`
	Modified bool   `json:"modified,omitempty"`
	// Providers says, for each provider that was never run against what it drives, how it
	// was verified (provider.Maturity).
	Providers map[string]string `json:"providers,omitempty"`
}

// buildInfo reads the binary's build information; a variable so tests can replace it.
var buildInfo = debug.ReadBuildInfo

func currentVersion() versionInfo {
	v := versionInfo{Version: "(devel)", GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	for _, p := range catalog.All() {
		if m, ok := p.(provider.Maturity); ok {
			if v.Providers == nil {
				v.Providers = map[string]string{}
			}
			v.Providers[p.Name()] = m.Maturity()
		}
	}
	info, ok := buildInfo()
	if !ok {
		return v
	}
	if info.Main.Version != "" {
		v.Version = info.Main.Version
	}
	if info.GoVersion != "" {
		v.GoVersion = info.GoVersion
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Commit = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}

func newVersionCmd() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the version of the CLI and the Go version it was built with",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return printVersion(cmd.OutOrStdout(), output, currentVersion())
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")
	return cmd
}

func printVersion(out io.Writer, format string, v versionInfo) error {
	switch format {
	case "text", "":
		fmt.Fprintf(out, "constellation %s\n", v.Version)
		fmt.Fprintf(out, "  go:       %s\n", v.GoVersion)
		fmt.Fprintf(out, "  platform: %s\n", v.Platform)
		if v.Commit != "" {
			dirty := ""
			if v.Modified {
				dirty = " (modified)"
			}
			fmt.Fprintf(out, "  commit:   %s%s\n", v.Commit, dirty)
		}
		for _, name := range slices.Sorted(maps.Keys(v.Providers)) {
			fmt.Fprintf(out, "  provider %s: %s\n", name, v.Providers[name])
		}
		return nil
	case "json":
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	default:
		return fmt.Errorf("unknown output format %q (known: text, json)", format)
	}
}
