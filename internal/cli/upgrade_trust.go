package cli

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/provider/catalog"
	"github.com/openconstellation/constellation/internal/release"
	"github.com/openconstellation/constellation/internal/release/releasedir"
	"github.com/openconstellation/constellation/internal/release/releasesource"
	"github.com/openconstellation/constellation/internal/state"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
)

// The pre-check that a release's first node can join the running cluster (docs/upgrades.md
// "A new node trusts the previous release's join services"). A joining node accepts a join
// service only of its own image or of the images its release names (`release create --from`,
// carried in its measured node configuration). A release made without the running image's
// would have its first node refuse every join service of the cluster, and apply would wait
// for it in vain; so apply and `upgrade check` refuse it before anything changes, naming the
// FROM it needs.

// checkJoinTrust refuses rel, for the initialized cluster st, unless its nodes trust the join
// services the cluster runs: every reference set the cluster admits by (the configuration's,
// which apply keeps equal to the cluster's) must be matched by the release's own sets or by
// a set its image trusts, as the joining node matches them. It also refuses a release whose
// node image does not say what its manifest says (release, Kubernetes version, services).
func checkJoinTrust(ctx context.Context, workspace string, conf *config.Config, st *state.State, rel *releasedir.Release) error {
	facts, err := releaseImageFacts(ctx, conf, rel)
	if err != nil {
		return err
	}
	untrusted := untrustedJoinServices(conf, rel, facts)
	if len(untrusted) == 0 {
		return nil
	}
	var names []string
	for _, s := range untrusted {
		names = append(names, s.Name)
	}
	trusts := "only their own image's join services"
	if len(facts.JoinServiceSets) > 0 {
		var others []string
		for _, s := range facts.JoinServiceSets {
			others = append(others, s.Name)
		}
		trusts = "only their own image's join services and those of reference set(s) " + strings.Join(others, ", ")
	}
	from, what := fromHint(ctx, workspace, st)
	return fmt.Errorf("release %s's nodes would not trust the join services of the running cluster, so its first node could not join: "+
		"the control planes run %s (reference set(s) %s), and the release's nodes trust %s. "+
		"Make a release that upgrades from it: make release VERSION=<new version> FROM=%s (release create --from)",
		rel.Version(), what, strings.Join(names, ", "), trusts, from)
}

// releaseImageFacts reads what rel's node image says about itself (before a URL release's
// image is fetched: through its signed listing) and checks it against the signed manifest.
func releaseImageFacts(ctx context.Context, conf *config.Config, rel *releasedir.Release) (provider.ImageFacts, error) {
	_, images, err := releaseRules(conf, "", false)
	if err != nil {
		return provider.ImageFacts{}, err
	}
	files, err := releasesource.Client{}.ImageFiles(ctx, rel)
	if err != nil {
		return provider.ImageFacts{}, err
	}
	facts, err := images.ReadImageFacts(files)
	if err != nil {
		return provider.ImageFacts{}, fmt.Errorf("release %s: %w", rel.Version(), err)
	}
	m := rel.Manifest()
	for _, c := range []struct{ what, image, manifest string }{
		{"release", facts.Release, m.Version},
		{"Kubernetes version", facts.KubernetesVersion, m.KubernetesVersion},
		{"services image", facts.ServicesImage, m.ServicesImage.Ref},
	} {
		if c.image != c.manifest {
			return provider.ImageFacts{}, &release.Error{Reason: release.ReasonMalformed, Err: fmt.Errorf(
				"release %s: its node image names %s %q, its manifest %q", rel.Version(), c.what, c.image, c.manifest)}
		}
	}
	return facts, nil
}

// untrustedJoinServices are the reference sets of the configuration (the images the cluster
// runs) that a node of rel would refuse as join services: none of the release's own sets or
// the sets its image trusts matches them (measurements.ReferenceSets.Match, the rule the
// node's check applies to a join service's evidence).
func untrustedJoinServices(conf *config.Config, rel *releasedir.Release, facts provider.ImageFacts) measurements.ReferenceSets {
	v := conf.Attestation.Variant()
	own, _ := rel.Reference(v) // the policy required it
	trusted := append(slices.Clone(own.Measurements), facts.JoinServiceSets...)
	var untrusted measurements.ReferenceSets
	for _, s := range conf.Attestation.Of(v).Measurements {
		presented := map[uint32][]byte{}
		for i, m := range s.Measurements {
			presented[i] = m.Expected
		}
		if _, err := trusted.Match(v, presented); err != nil {
			untrusted = append(untrusted, s)
		}
	}
	return untrusted
}

// fromHint names what a release must upgrade from to run on st's cluster: its release, or
// the node images its control planes boot as the platform reports them (read only), and
// describes it.
func fromHint(ctx context.Context, workspace string, st *state.State) (from, what string) {
	if st.Release != "" {
		return st.Release, "release " + st.Release
	}
	const unknown = "<the node image directory the control planes boot>"
	p, err := platformOf(workspace, st)
	if err != nil {
		return unknown, "a node image that is not a release"
	}
	nctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	nodes, err := p.Nodes(nctx)
	if err != nil {
		return unknown, "a node image that is not a release"
	}
	var images []string
	for _, n := range nodes {
		if n.Role == metadata.ControlPlane && n.Image != "" && !slices.Contains(images, n.Image) {
			images = append(images, n.Image)
		}
	}
	if len(images) == 0 {
		return unknown, "a node image that is not a release"
	}
	list := strings.Join(images, " ")
	if platform, err := catalog.Lookup(st.Provider); err == nil {
		if _, sandbox := platform.(provider.NodeImages); !sandbox {
			// A cloud's image names no folder release create can read.
			return "<the node image directory " + list + " was made from>", "the node image " + list
		}
	}
	if len(images) > 1 {
		return fmt.Sprintf("%q", list), "the node images " + list
	}
	return list, "the node image " + list
}
