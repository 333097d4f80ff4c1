package local

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/version"

	"github.com/openconstellation/constellation/internal/clusterrecord"
	"github.com/openconstellation/constellation/internal/nodeimage"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/strictjson"
)

// NodeConfigFile is the node configuration of a local node image (measured into PCR 12 with
// the containerd configuration).
const NodeConfigFile = "node-config.json"

// NodeConfig is what a node image says about itself beyond its binaries. Because it is
// measured, what a control plane deploys at init (the services image, by content hash) is
// part of the node's attested identity: a node configured to deploy another join service
// does not match the reference values.
type NodeConfig struct {
	// KubernetesVersion is the only version the image runs, e.g. "v1.34.4".
	KubernetesVersion string `json:"kubernetesVersion"`
	// Provider is "local".
	Provider string `json:"provider"`
	// ServicesImage is the image of the join, key and verification services a control plane
	// deploys at init, e.g. "localhost/constellation/services:<content hash>"; every node
	// imports it, so it is never pulled.
	ServicesImage string `json:"servicesImage"`
	// Release is the version of the release the image belongs to ("v1.2.3", docs/releases.md),
	// empty for an image built outside a release. Measured with the rest, so a node's
	// release is part of its attested identity and two releases never share measurements.
	Release string `json:"release,omitempty"`
	// JoinServiceSets are the images, besides its own, whose join services a node of this
	// image trusts (joinservice.ServiceCheck): the releases it upgrades from, so that its
	// first node can join a cluster whose control planes still run the previous release.
	// Measured with the rest: which join services a node trusts is part of its identity.
	JoinServiceSets measurements.ReferenceSets `json:"joinServiceSets,omitempty"`
}

// Validate names every problem of c.
func (c NodeConfig) Validate() error {
	var problems []error
	if !clusterrecord.IsKubernetesVersion(c.KubernetesVersion) {
		problems = append(problems, fmt.Errorf("kubernetesVersion %q: want v1.X.Y", c.KubernetesVersion))
	}
	if c.Provider != "local" {
		problems = append(problems, fmt.Errorf("provider %q: want local", c.Provider))
	}
	if !nodeimage.IsPinnedRef(c.ServicesImage) {
		problems = append(problems, fmt.Errorf("servicesImage %q: want registry/name:tag or registry/name@sha256:digest", c.ServicesImage))
	}
	if c.Release != "" {
		if _, err := version.ParseSemantic(c.Release); err != nil || !strings.HasPrefix(c.Release, "v") {
			problems = append(problems, fmt.Errorf("release %q: want a semantic version v1.2.3", c.Release))
		}
	}
	if len(c.JoinServiceSets) > 0 {
		if err := c.JoinServiceSets.Validate(Variant); err != nil {
			problems = append(problems, fmt.Errorf("joinServiceSets: %w", err))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("node configuration: %w", errors.Join(problems...))
	}
	return nil
}

// Marshal returns the file's bytes (one line of JSON): the same config always gives the same
// bytes, so the same measurement.
func (c NodeConfig) Marshal() ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	data, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}

// ParseNodeConfig decodes node-config.json strictly (strictjson.Unmarshal: unknown fields, a
// field twice or in other letter case, and trailing data are errors) and validates it.
func ParseNodeConfig(data []byte) (NodeConfig, error) {
	var c NodeConfig
	if err := strictjson.Unmarshal(data, &c); err != nil {
		return NodeConfig{}, fmt.Errorf("decoding %s: %w", NodeConfigFile, err)
	}
	if err := c.Validate(); err != nil {
		return NodeConfig{}, err
	}
	return c, nil
}
