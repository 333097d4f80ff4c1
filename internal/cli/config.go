package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/provider/catalog"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
)

func newConfigCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Work with the cluster configuration (" + config.FileName + ")",
	}
	generate := &cobra.Command{
		Use:   "generate",
		Short: "Write a configuration for a provider into the workspace",
	}
	generate.AddCommand(newConfigGenerateLocalCmd(), newConfigGenerateQEMUCmd(), newConfigGenerateAzureCmd())
	cmd.AddCommand(generate)
	return cmd
}

// generateLocalOptions are the flags of `config generate local`.
type generateLocalOptions struct {
	name          string
	image         string
	controlPlanes int
	workers       int
	force         bool
	// kubernetesVersion is the configuration's; kubeDir and imagesDir build the default node
	// image of it when image is empty.
	kubernetesVersion, kubeDir, imagesDir string
	// imageRef, if set, is what the provider block's image names instead of the image folder
	// (a cloud's stored copy of it: image upload); settings are the block's settings.
	imageRef string
	settings map[string]any
}

// defaultImageDir is where `config generate local` lays out the default node image.
const defaultImageDir = "node-image"

func newConfigGenerateLocalCmd() *cobra.Command {
	var o generateLocalOptions
	cmd := &cobra.Command{
		Use:   "local",
		Short: "Write a configuration for a local cluster, with reference values measured from the node image",
		Long: `Write ` + config.FileName + ` for the local provider into the workspace.

The reference values (attestation.qemuVTPM.measurements) are computed offline from the node
image directory given by --image: each file is measured into its PCR as the provider does at
boot (docs/attestation.md), so the configuration admits exactly the nodes that boot this
image. Without --image, the default image of the Kubernetes version (--kubernetes-version) is
laid out in <workspace>/` + defaultImageDir + ` from the bootstrapper installed next to this
binary, the version's Kubernetes binaries (<--kube-dir>/<version>/bin) and the services image
named in the container image index (--images). An image given by --image must run the
configuration's Kubernetes version (create checks its node-config.json). An existing
configuration is kept unless --force is given.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ws, err := cmd.Flags().GetString("workspace")
			if err != nil {
				return err
			}
			return generateLocal(cmd.OutOrStdout(), ws, o)
		},
	}
	cmd.Flags().StringVar(&o.name, "name", "constellation", "cluster name (a DNS label)")
	cmd.Flags().StringVar(&o.image, "image", "", "node image directory ("+strings.Join(imageFiles(), ", ")+"); default: lay out the default image")
	cmd.Flags().StringVar(&o.kubernetesVersion, "kubernetes-version", config.DefaultKubernetesVersion, "Kubernetes version of the cluster ("+strings.Join(config.SupportedKubernetesVersions, ", ")+")")
	addKubeDirFlag(cmd, &o.kubeDir)
	addImagesFlag(cmd, &o.imagesDir)
	cmd.Flags().IntVar(&o.controlPlanes, "control-planes", 1, "number of control-plane nodes")
	cmd.Flags().IntVar(&o.workers, "workers", 1, "number of worker nodes")
	cmd.Flags().BoolVar(&o.force, "force", false, "replace an existing configuration")
	return cmd
}

func generateLocal(out io.Writer, workspace string, o generateLocalOptions) error {
	path := filepath.Join(workspace, config.FileName)
	if err := refuseOverwrite(path, o.force); err != nil {
		return err
	}
	if o.image == "" {
		o.image = filepath.Join(workspace, defaultImageDir)
		if err := layOutDefaultImage(o.image, o.kubernetesVersion, o.kubeDir, o.imagesDir); err != nil {
			return fmt.Errorf("laying out the default node image: %w", err)
		}
		fmt.Fprintf(out, "Laid out the default node image in %s.\n", o.image)
	}
	return writeGenerated(out, workspace, localPlatform(), o)
}

// writeGenerated writes the configuration for platform with the reference values it predicts
// for the node image o.image.
func writeGenerated(out io.Writer, workspace string, platform provider.Platform, o generateLocalOptions) error {
	path := filepath.Join(workspace, config.FileName)
	imageDir, err := filepath.Abs(o.image)
	if err != nil {
		return fmt.Errorf("node image directory: %w", err)
	}
	if info, err := os.Stat(imageDir); err != nil {
		return fmt.Errorf("node image directory: %w", err)
	} else if !info.IsDir() {
		return fmt.Errorf("node image %s is not a directory", imageDir)
	}
	reference, err := platform.ReferenceValues(imageDir)
	if err != nil {
		return fmt.Errorf("measuring the node image %s: %w", imageDir, err)
	}
	expected := reference.Measurements
	setName := config.ReferenceSetName(platform.Name()+"-", expected)

	c := config.Default()
	c.Name = o.name
	if o.kubernetesVersion != "" {
		c.KubernetesVersion = o.kubernetesVersion
	}
	image := imagePathFor(workspace, imageDir)
	if o.imageRef != "" {
		image = o.imageRef
	}
	c.Provider = config.ProviderFor(platform.Name(), config.ProviderBlock{
		ControlPlanes: o.controlPlanes,
		Workers:       o.workers,
		Image:         image,
		Settings:      o.settings,
	})
	// The block of the variant the provider's nodes attest with: the one its records name,
	// else its default.
	v := reference.Variant
	if v.IsZero() {
		v = platform.ConfigRules().Variants()[0]
	}
	c.Attestation = config.AttestationFor(v, config.VariantConfig{
		Measurements:   measurements.ReferenceSets{{Name: setName, Measurements: expected}},
		HardwareValues: reference.Hardware,
	})
	if err := c.Validate(); err != nil {
		return fmt.Errorf("the flags give an invalid configuration:\n%w", err)
	}
	if err := os.MkdirAll(workspace, 0o755); err != nil {
		return fmt.Errorf("creating the workspace: %w", err)
	}
	if err := config.Write(path, c, o.force); err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("refusing to overwrite %s (use --force to replace it): %w", path, err)
		}
		return err
	}

	fmt.Fprintf(out, "Wrote %s: cluster %q, %d control plane(s), %d worker(s), Kubernetes %s.\n",
		path, c.Name, o.controlPlanes, o.workers, c.KubernetesVersion)
	fmt.Fprintf(out, "Reference values %q, computed from the node image %s:\n", setName, imageDir)
	for _, i := range expected.Indices() {
		if names, ok := reference.Components[i]; ok {
			fmt.Fprintf(out, "  PCR %-2d %x  (%s)\n", i, expected[i].Expected, strings.Join(names, ", "))
		}
	}
	fmt.Fprintf(out, "  PCRs 0-14 not listed must read zero.\n")
	return nil
}

func newConfigGenerateQEMUCmd() *cobra.Command {
	var o generateLocalOptions
	var firmwareRecord string
	cmd := &cobra.Command{
		Use:   "qemu",
		Short: "Write a configuration for a cluster of QEMU machines, with reference values predicted from the node OS image",
		Long: `Write ` + config.FileName + ` for the QEMU provider into the workspace.

The nodes are QEMU virtual machines booting the node OS image given by --image (a folder
that make vm-image writes: disk.raw, uki.efi, manifest.json) with OVMF firmware measuring the
boot into each machine's TPM. The reference values (attestation.qemuVTPM.measurements) are
predicted from the image's UKI (PCRs 4, 9, 11 and the registers that must read zero) and its
partition table (PCR 5), and taken from the recorded observation of the firmware the
provider boots (PCRs 0-3, 6, 7): docs/measured-boot.md. For a firmware build or machine
shape the built-in records do not cover, record one on this host (go run ./hack/qemu-firmware)
and pass it with --firmware-record. An existing configuration is kept unless --force is
given.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ws, err := cmd.Flags().GetString("workspace")
			if err != nil {
				return err
			}
			if err := refuseOverwrite(filepath.Join(ws, config.FileName), o.force); err != nil {
				return err
			}
			p, err := catalog.Lookup("qemu")
			if err != nil {
				return err
			}
			if firmwareRecord != "" {
				if p, err = withFirmwareRecord(p, firmwareRecord); err != nil {
					return err
				}
			}
			return writeGenerated(cmd.OutOrStdout(), ws, p, o)
		},
	}
	cmd.Flags().StringVar(&o.name, "name", "constellation", "cluster name (a DNS label)")
	cmd.Flags().StringVar(&o.image, "image", "", "node OS image folder (make vm-image writes _output/vm-image)")
	_ = cmd.MarkFlagRequired("image")
	cmd.Flags().StringVar(&o.kubernetesVersion, "kubernetes-version", config.DefaultKubernetesVersion, "Kubernetes version of the cluster (the image's)")
	cmd.Flags().IntVar(&o.controlPlanes, "control-planes", 1, "number of control-plane machines")
	cmd.Flags().IntVar(&o.workers, "workers", 0, "number of worker machines")
	cmd.Flags().BoolVar(&o.force, "force", false, "replace an existing configuration")
	cmd.Flags().StringVar(&firmwareRecord, "firmware-record", "", "a firmware record observed on this host (hack/qemu-firmware) for a firmware build or machine shape without a built-in one")
	return cmd
}

// withFirmwareRecord returns p that also knows the firmware record in file.
func withFirmwareRecord(p provider.Platform, file string) (provider.Platform, error) {
	fr, ok := p.(provider.FirmwareRecorded)
	if !ok {
		return nil, fmt.Errorf("provider %s takes no firmware record", p.Name())
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("firmware record: %w", err)
	}
	p, err = fr.WithFirmwareRecord(raw)
	if err != nil {
		return nil, fmt.Errorf("firmware record %s: %w", file, err)
	}
	return p, nil
}

// imageFiles names the files of a local node image, for the help text.
func imageFiles() []string {
	if images, ok := localPlatform().(provider.NodeImages); ok {
		return images.ImageFiles()
	}
	return nil
}

// imagePathFor returns how the configuration refers to the image directory: relative to the
// workspace when it lies inside it (the workspace can move), absolute otherwise.
func imagePathFor(workspace, imageDir string) string {
	ws, err := filepath.Abs(workspace)
	if err != nil {
		return imageDir
	}
	rel, err := filepath.Rel(ws, imageDir)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return imageDir
	}
	return rel
}

func newConfigGenerateAzureCmd() *cobra.Command {
	var o generateLocalOptions
	var firmwareRecord string
	var settings []string
	cmd := &cobra.Command{
		Use:   "azure",
		Short: "Write a configuration for a cluster of Azure confidential VMs, with reference values predicted from the node OS image",
		Long: `Write ` + config.FileName + ` for the Azure provider into the workspace (docs/azure.md).

The nodes boot the gallery image version --image-ref names (constellation image upload azure
prints it), stored from the node OS image folder --image. The reference values are predicted
from that folder's UKI and disk (PCRs 4, 5, 9, 11 and the registers that must read zero) and
taken from --firmware-record for the registers Azure's firmware measures (PCRs 0-3, 6, 7): a
record of values observed on a node of the variant on Azure, with the hardware reference its
report met (docs/azure.md "Reference values"); the record's variant is the configuration's.
--set gives the provider's settings (subscriptionID, resourceGroup, location, vmSize,
diskEncryption, stateDiskGiB). An existing configuration is kept unless --force is given.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ws, err := cmd.Flags().GetString("workspace")
			if err != nil {
				return err
			}
			if err := refuseOverwrite(filepath.Join(ws, config.FileName), o.force); err != nil {
				return err
			}
			pairs, err := parseSettings(settings)
			if err != nil {
				return err
			}
			o.settings = map[string]any{}
			for k, v := range pairs {
				o.settings[k] = settingValue(v)
			}
			p, err := catalog.Lookup("azure")
			if err != nil {
				return err
			}
			if p, err = withFirmwareRecord(p, firmwareRecord); err != nil {
				return err
			}
			return writeGenerated(cmd.OutOrStdout(), ws, p, o)
		},
	}
	cmd.Flags().StringVar(&o.name, "name", "constellation", "cluster name (a DNS label)")
	cmd.Flags().StringVar(&o.image, "image", "", "node OS image folder the reference values are predicted from (make vm-image writes _output/vm-image)")
	cmd.Flags().StringVar(&o.imageRef, "image-ref", "", "the gallery image version the nodes boot (constellation image upload azure prints it)")
	cmd.Flags().StringVar(&firmwareRecord, "firmware-record", "", "the values Azure's firmware measured on a node, observed by you (docs/azure.md \"Reference values\")")
	cmd.Flags().StringArrayVar(&settings, "set", nil, "a provider setting, KEY=VALUE (repeatable): subscriptionID, resourceGroup, location, vmSize, ...")
	cmd.Flags().StringVar(&o.kubernetesVersion, "kubernetes-version", config.DefaultKubernetesVersion, "Kubernetes version of the cluster (the image's)")
	cmd.Flags().IntVar(&o.controlPlanes, "control-planes", 1, "number of control-plane VMs")
	cmd.Flags().IntVar(&o.workers, "workers", 0, "number of worker VMs")
	cmd.Flags().BoolVar(&o.force, "force", false, "replace an existing configuration")
	for _, f := range []string{"image", "image-ref", "firmware-record"} {
		_ = cmd.MarkFlagRequired(f)
	}
	return cmd
}

// settingValue reads a --set value as the configuration would: a number or a boolean as
// such, anything else as a string.
func settingValue(v string) any {
	if n, err := strconv.Atoi(v); err == nil {
		return n
	}
	switch v {
	case "true":
		return true
	case "false":
		return false
	}
	return v
}

// refuseOverwrite refuses an existing configuration at path unless force.
func refuseOverwrite(path string, force bool) error {
	if _, err := os.Lstat(path); err == nil && !force {
		return fmt.Errorf("refusing to overwrite %s (use --force to replace it): %w", path, os.ErrExist)
	}
	return nil
}
