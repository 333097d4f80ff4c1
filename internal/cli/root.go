// Package cli implements the constellation command line.
package cli

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/openconstellation/constellation/internal/provider"
)

// NewRootCmd returns the constellation command tree.
func NewRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "constellation",
		Short:         "Manage always-encrypted, attested Kubernetes clusters",
		SilenceUsage:  true,
		SilenceErrors: false,
		// A platform whose operations take minutes (a cloud's) says what it waits for on
		// stderr (provider.Progressf).
		PersistentPreRun: func(cmd *cobra.Command, _ []string) {
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			cmd.SetContext(provider.WithProgress(ctx, cmd.ErrOrStderr()))
		},
	}
	root.PersistentFlags().StringP("workspace", "C", ".", "workspace directory holding the cluster's files")
	root.AddCommand(newConfigCmd(), newCreateCmd(), newApplyCmd(), newVerifyCmd(), newVerifyEvidenceCmd(), newTerminateCmd(), newMiniCmd(), newVersionCmd(),
		newStatusCmd(), newImageCmd(), newRebootCmd(), newStopCmd(), newStartCmd(), newRecoverCmd(), newUpgradeCmd())
	return root
}
