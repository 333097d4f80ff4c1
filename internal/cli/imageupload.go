package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/provider/catalog"
)

func newImageUploadCmd() *cobra.Command {
	var timeout time.Duration
	var req provider.ImageUploadRequest
	var settings []string
	cmd := &cobra.Command{
		Use:   "upload PROVIDER",
		Short: "Store the node OS image in a cloud, for its clusters' nodes to boot",
		Long: `Store the node OS image (the folder make vm-image writes) in the provider's image store,
under --version, and print the reference the configuration's provider.<name>.image takes.
--set gives where, by the provider's own keys (Azure: subscriptionID, resourceGroup,
location, and gallery and definition with defaults; docs/azure.md "Image upload"). A rerun
finds the image it stored; another image under the same version is refused. Credentials come
from the provider's standard chain (Azure: az login, environment, managed identity); none is
written anywhere.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := catalog.Lookup(args[0])
			if err != nil {
				return err
			}
			up, ok := p.(provider.ImageUploader)
			if !ok {
				return fmt.Errorf("provider %s keeps no node OS images (its nodes boot the image folder itself)", args[0])
			}
			if req.Settings, err = parseSettings(settings); err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			ref, err := up.UploadImage(ctx, req)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Stored the node OS image %s as version %s:\n%s\n", req.Image, req.Version, ref)
			return nil
		},
	}
	cmd.Flags().StringVar(&req.Image, "image", "", "node OS image folder (make vm-image writes _output/vm-image)")
	cmd.Flags().StringVar(&req.Version, "version", "", "the stored image's version (MAJOR.MINOR.PATCH)")
	cmd.Flags().StringArrayVar(&settings, "set", nil, "where to store it, as KEY=VALUE (repeatable): the provider's keys")
	cmd.Flags().DurationVar(&timeout, "timeout", time.Hour, "give up after this long")
	_ = cmd.MarkFlagRequired("image")
	_ = cmd.MarkFlagRequired("version")
	return cmd
}

// parseSettings reads KEY=VALUE pairs; a key given twice is refused.
func parseSettings(pairs []string) (map[string]string, error) {
	out := map[string]string{}
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--set %q: want KEY=VALUE", p)
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("--set: %s is given twice", k)
		}
		out[k] = v
	}
	return out, nil
}
