package publish

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/openconstellation/constellation/internal/fileutil"
	"github.com/openconstellation/constellation/internal/provider/catalog"
	"github.com/openconstellation/constellation/internal/release"
)

// NewCommand is the command line of cmd/release: keygen and create.
func NewCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "release",
		Short:         "Make signed Constellation releases (docs/releases.md)",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newKeygenCmd(), newCreateCmd())
	return root
}

func newKeygenCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "keygen PRIVATE-KEY-FILE",
		Short: "Generate a release key: PRIVATE-KEY-FILE (PKCS #8 PEM, mode 0600) and PRIVATE-KEY-FILE.pub, the key CLIs pin",
		Long: `Generate an ECDSA P-256 release key. The private key signs releases and must never leave
the release machine; the public key (.pub) is what a cluster's configuration pins
(release.key). Existing files are never replaced: a new key would make every CLI that pins
the old one refuse the releases it signs.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := release.GenerateKey()
			if err != nil {
				return err
			}
			priv, err := s.MarshalPrivatePEM()
			if err != nil {
				return err
			}
			pub, err := s.Public().MarshalPEM()
			if err != nil {
				return err
			}
			if err := fileutil.CreateAtomic(args[0], priv, 0o600); err != nil {
				return fmt.Errorf("writing the private key: %w", err)
			}
			if err := fileutil.CreateAtomic(args[0]+".pub", pub, 0o644); err != nil {
				return fmt.Errorf("writing the public key: %w", err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "release key %s written to %s (public: %s.pub)\n", s.Public().KeyID(), args[0], args[0])
			return nil
		},
	}
}

func newCreateCmd() *cobra.Command {
	var o Options
	var keyFile, providerName string
	var cloudImages []string
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Lay out, measure and sign release --version into --source/<version>",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			keyPEM, err := os.ReadFile(keyFile)
			if err != nil {
				return fmt.Errorf("release key: %w", err)
			}
			if o.Signer, err = release.ParseSigner(keyPEM); err != nil {
				return fmt.Errorf("release key %s: %w", keyFile, err)
			}
			if o.Platform, err = catalog.Lookup(providerName); err != nil {
				return err
			}
			for _, c := range cloudImages {
				img, err := ParseCloudImage(c)
				if err != nil {
					return err
				}
				o.CloudImages = append(o.CloudImages, img)
			}
			dir, err := Publish(cmd.Context(), o)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "release %s written to %s, signed by %s\n", o.Version, dir, o.Signer.Public().KeyID())
			return nil
		},
	}
	cmd.Flags().StringVar(&keyFile, "key", "", "the release's private key (release keygen)")
	cmd.Flags().StringVar(&o.Version, "version", "", "the release's semantic version, e.g. v0.2.0")
	cmd.Flags().StringVar(&o.Source, "source", "", "the release source to write the release into")
	cmd.Flags().StringVar(&o.BaseImage, "base-image", "", "the node image the release's image is made from")
	cmd.Flags().StringVar(&o.ImagesDir, "images", "", "where make images wrote the container images: the release's services image is built from the services binaries in its bin folder")
	cmd.Flags().StringVar(&providerName, "provider", "local", "the provider whose node image this is")
	cmd.Flags().StringArrayVar(&o.From, "from", nil, "a release directory or node image the release upgrades from: its nodes trust that image's join services (repeatable)")
	cmd.Flags().StringArrayVar(&cloudImages, "cloud-image", nil, "PROVIDER=REF@sha256:HEX: the release's image in a cloud's image store, what the cloud's nodes of the release boot (constellation image upload prints REF; HEX is the SHA-256 of the raw disk it stored, which Azure's version carries as its constellation-image-sha256 tag) (repeatable)")
	for _, f := range []string{"key", "version", "source", "base-image", "images"} {
		_ = cmd.MarkFlagRequired(f)
	}
	return cmd
}
