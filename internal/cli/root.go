// Package cli implements the constellation command line.
package cli

import (
	"fmt"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// NewRootCmd returns the constellation command tree.
func NewRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "constellation",
		Short:         "Manage always-encrypted, attested Kubernetes clusters",
		SilenceUsage:  true,
		SilenceErrors: false,
	}
	root.PersistentFlags().StringP("workspace", "C", ".", "workspace directory holding the cluster's files")
	root.AddCommand(newMiniCmd(), newVersionCmd())
	return root
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			version := "(devel)"
			if info, ok := debug.ReadBuildInfo(); ok && info.Main.Version != "" {
				version = info.Main.Version
			}
			fmt.Fprintf(cmd.OutOrStdout(), "constellation %s\n", version)
			return nil
		},
	}
}
