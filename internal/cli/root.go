// Package cli implements the constellation command line.
package cli

import "github.com/spf13/cobra"

// NewRootCmd returns the constellation command tree.
func NewRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "constellation",
		Short:         "Manage always-encrypted, attested Kubernetes clusters",
		SilenceUsage:  true,
		SilenceErrors: false,
	}
	root.PersistentFlags().StringP("workspace", "C", ".", "workspace directory holding the cluster's files")
	root.AddCommand(newConfigCmd(), newCreateCmd(), newApplyCmd(), newVerifyCmd(), newVerifyEvidenceCmd(), newTerminateCmd(), newMiniCmd(), newVersionCmd(),
		newStatusCmd(), newImageCmd(), newRebootCmd(), newStopCmd(), newStartCmd(), newRecoverCmd(), newUpgradeCmd())
	return root
}
