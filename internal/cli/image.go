package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/openconstellation/constellation/internal/imageload"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/state"
)

func newImageCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "image",
		Short: "Container images of the cluster's nodes; node OS images in a cloud",
	}
	cmd.AddCommand(newImageLoadCmd(), newImageUploadCmd())
	return cmd
}

func newImageLoadCmd() *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "load ARCHIVE|OCI-DIR...",
		Short: "Load container images into every node of the cluster, now and at every boot",
		Long: `Load container images into the cluster's nodes, as 'kind load' does: docker-save archives
(docker save, podman save) and OCI image layout directories; of a multi-platform index, the
image of the nodes' platform. Every image is read completely and its digests checked first: a
corrupt or truncated input fails, naming it, and nothing is loaded. The images are stored with
the cluster (its folder's loaded-images/) and imported into every running node's containerd;
nodes that are off, reboot, or are added later import them when they boot. Loading an image
under a name again replaces it. Pods use them by name (imagePullPolicy IfNotPresent or Never).
Loaded images are not secret: they stay on the host unencrypted, as in a registry, and a
node's containerd keeps them on its tmpfs, outside its encrypted state.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ws, err := absWorkspace(cmd)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			return loadImages(ctx, cmd.OutOrStdout(), ws, args)
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Minute, "give up after this long")
	return cmd
}

// loadImages reads and checks every input, stores the images with the cluster, and imports
// them into the running nodes.
func loadImages(ctx context.Context, out io.Writer, workspace string, inputs []string) error {
	st, err := state.Load(filepath.Join(workspace, state.FileName))
	if err != nil {
		return err
	}
	p, err := providerOf(st)
	if err != nil {
		return err
	}
	loader, ok := p.(provider.ImageLoader)
	if !ok {
		return fmt.Errorf("the %s platform's nodes pull their images from registries: push the image to one", p.Name())
	}
	images, err := imageload.Read(inputs, imageload.NodePlatform)
	if err != nil {
		return err
	}
	paths, err := imageload.Store(loader.LoadedImagesDir(workspace), images)
	if err != nil {
		return err
	}
	for _, img := range images {
		fmt.Fprintf(out, "stored %s (%s) from %s\n", img.Ref, img.Digest, img.Source)
	}
	names := make([]string, len(paths))
	for i, path := range paths {
		names[i] = filepath.Base(path)
	}
	loads, err := loader.LoadImages(ctx, workspace, names)
	if errors.Is(err, provider.ErrNotRunning) {
		fmt.Fprintln(out, "the cluster is stopped: its nodes import the images when they start")
		return nil
	}
	if err != nil {
		return fmt.Errorf("%w (the images are stored: every node imports them at its next boot; run image load again to import them now)", err)
	}
	return reportImageLoads(out, loads, len(images))
}

// reportImageLoads prints each node's outcome and fails naming the nodes that did not import.
func reportImageLoads(out io.Writer, loads []provider.ImageLoad, images int) error {
	var failed []string
	for _, l := range loads {
		switch {
		case l.Error != "":
			failed = append(failed, l.Node)
			fmt.Fprintf(out, "FAIL  %s: %s\n", l.Node, l.Error)
		case l.Deferred:
			fmt.Fprintf(out, "later %s: off; imports the images when it boots\n", l.Node)
		default:
			fmt.Fprintf(out, "OK    %s: %d image(s) imported\n", l.Node, images)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d of %d nodes did not import the images (%s); they are stored, so each imports them at its next boot, or run image load again", len(failed), len(loads), strings.Join(failed, ", "))
	}
	return nil
}
