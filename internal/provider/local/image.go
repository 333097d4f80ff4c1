package local

import (
	"errors"
	"path/filepath"
)

// PCRKubernetes holds the Kubernetes node binaries (kubelet, then kubeadm).
const PCRKubernetes = 13

// Files of a node image directory and the PCR each is measured into (docs/attestation.md).
// The order is the boot order, so it is part of the measurement.
var imageFiles = []struct {
	name string
	pcr  int
}{
	{"bootstrapper", PCRBootstrapper},
	{"kubelet", PCRKubernetes},
	{"kubeadm", PCRKubernetes},
	{"containerd.toml", PCRNodeConfig},
	{"node-config.json", PCRNodeConfig},
}

// ImageFiles returns the names of the files a node image directory holds, in measurement
// order.
func ImageFiles() []string {
	names := make([]string, len(imageFiles))
	for i, f := range imageFiles {
		names[i] = f.name
	}
	return names
}

// ImageComponents measures the files of a node image directory: what the provider extends
// into a node's vTPM before the node's software starts, and what ExpectedPCRs turns into
// reference values offline. A directory that lacks files is refused, naming each missing one.
func ImageComponents(dir string) ([]Component, error) {
	var out []Component
	var problems []error
	for _, f := range imageFiles {
		c, err := FileComponent(f.name, f.pcr, filepath.Join(dir, f.name))
		if err != nil {
			problems = append(problems, err)
			continue
		}
		out = append(out, c)
	}
	if len(problems) > 0 {
		return nil, errors.Join(problems...)
	}
	return out, nil
}
