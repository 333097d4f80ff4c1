package cli

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/deploy"
	"github.com/openconstellation/constellation/internal/joinservice/refusals"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/provider/catalog"
	"github.com/openconstellation/constellation/internal/release"
	"github.com/openconstellation/constellation/internal/release/releasedir"
	"github.com/openconstellation/constellation/internal/release/releasesource"
	"github.com/openconstellation/constellation/internal/retry"
	"github.com/openconstellation/constellation/internal/state"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/verify"
)

// configuredImage resolves the node image of the configuration. A release directory is
// opened, and so checked whole (its signature by the pinned key, the policy: every image
// register enforced, no downgrade unless allowed, the cluster's variant, an image for the
// cluster's cloud; its node image against the signed digest), before anything changes; its
// node image is what nodes boot, or on a cloud the image the release names there
// (release.CloudImage). Another directory (or a cloud's image reference) is a plain node
// image, booted as it is (development images; an upgrade refuses it, see upgrade.run).
func configuredImage(ctx context.Context, workspace string, conf *config.Config, running string, allowDowngrade bool) (string, *releasedir.Release, error) {
	dir := conf.Provider.Block().ImagePath(workspace)
	// A provider that boots no release images (QEMU) still boots a plain image.
	policy, _, rulesErr := releaseRules(conf, running, allowDowngrade)
	if releasesource.IsURL(dir) {
		if rulesErr != nil {
			return "", nil, rulesErr
		}
		fetched, err := fetchRelease(ctx, workspace, conf, dir, policy)
		if err != nil {
			return "", nil, err
		}
		dir = fetched
	}
	if !releasedir.IsRelease(dir) {
		return dir, nil, nil
	}
	if rulesErr != nil {
		return "", nil, rulesErr
	}
	rel, err := openRelease(ctx, workspace, conf, dir, policy)
	if err != nil {
		return "", nil, err
	}
	if k := rel.Manifest().KubernetesVersion; k != conf.KubernetesVersion {
		return "", nil, fmt.Errorf("%s: kubernetesVersion is %s, but release %s runs Kubernetes %s: set kubernetesVersion: %s (the two change together)",
			config.FileName, conf.KubernetesVersion, rel.Version(), k, k)
	}
	if policy.CloudImageOf != "" {
		img, _ := rel.CloudImage(policy.CloudImageOf) // the policy required it
		return img.Ref, rel, nil
	}
	return rel.NodeImage(), rel, nil
}

// fetchedReleases is where the workspace keeps the releases it fetched from URLs.
const fetchedReleases = "releases"

// fetchRelease downloads the release at u into the workspace (releases/<version>), checked
// against the pinned key and the policy as it comes in (releasesource.Client.Fetch), unless
// an earlier apply fetched it already: then it is opened, and so checked, again, including
// that it is the version it is kept as (a copy there that is another release, whoever wrote
// it, is refused and fetched again). u's last element must be the release's version: it
// names the directory, and the release must sign it.
func fetchRelease(ctx context.Context, workspace string, conf *config.Config, u string, policy release.Policy) (string, error) {
	name := releasesource.Name(u)
	if !release.IsVersion(name) {
		return "", fmt.Errorf("%s: provider image %s: %q is not a release version: a release URL is <source>/<version>, e.g. <source>/v0.2.0", config.FileName, u, name)
	}
	into := filepath.Join(workspace, fetchedReleases)
	cached := filepath.Join(into, name)
	var cacheErr error
	if releasedir.IsRelease(cached) {
		if _, cacheErr = openRelease(ctx, workspace, conf, cached, policy); cacheErr == nil {
			return cached, nil
		}
	}
	key, err := pinnedReleaseKey(workspace, conf)
	if err != nil {
		return "", err
	}
	fctx, cancel := context.WithTimeout(ctx, 15*time.Minute)
	defer cancel()
	dir, err := (releasesource.Client{}).Fetch(fctx, u, into, key, policy)
	if err != nil && cacheErr != nil {
		return "", fmt.Errorf("the copy of %s kept in %s was refused (%w), and fetching it again failed: %w", name, cached, cacheErr, err)
	}
	return dir, err
}

// openRelease opens the release in dir with the key the configuration pins.
func openRelease(ctx context.Context, workspace string, conf *config.Config, dir string, policy release.Policy) (*releasedir.Release, error) {
	key, err := pinnedReleaseKey(workspace, conf)
	if err != nil {
		return nil, err
	}
	_, images, err := releaseRules(conf, "", false)
	if err != nil {
		return nil, err
	}
	return releasedir.Open(ctx, dir, key, policy, images.ImageDigest)
}

// pinnedReleaseKey reads the release key the configuration pins.
func pinnedReleaseKey(workspace string, conf *config.Config) (*release.PublicKey, error) {
	path := conf.Release.KeyPath(workspace)
	if path == "" {
		return nil, fmt.Errorf("%s: release.key: missing: a release is booted only if the key the configuration pins signed it (make release-key writes the local one, _output/release-key.pem.pub)", config.FileName)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s: release.key: %w", config.FileName, err)
	}
	key, err := release.ParsePublicKey(data)
	if err != nil {
		return nil, fmt.Errorf("%s: release.key %s: %w", config.FileName, path, err)
	}
	return key, nil
}

// releaseRules are what conf's cluster requires of a release (running is the release it
// runs, "" before it exists) and how the CLI reads a release's node image (its digest, what
// it says about itself). A provider that lays out node images (provider.NodeImages: the
// sandbox) boots the release's node image itself. A cloud's nodes (a provider that stores
// node OS images in the cloud, provider.ImageUploader) boot the image the release names for
// the cloud instead (release.CloudImage, required by the policy), made
// from that node image, which is read as the sandbox reads it: the one format a release's
// node image has (docs/releases.md "Cloud images").
func releaseRules(conf *config.Config, running string, allowDowngrade bool) (release.Policy, provider.NodeImages, error) {
	policy := release.Policy{Running: running, AllowDowngrade: allowDowngrade, Variant: conf.Attestation.Variant()}
	platform, err := catalog.Lookup(conf.Provider.Name())
	if err != nil {
		return release.Policy{}, nil, fmt.Errorf("%s: %w", config.FileName, err)
	}
	if images, ok := platform.(provider.NodeImages); ok {
		return policy, images, nil
	}
	if _, ok := platform.(provider.ImageUploader); !ok {
		return release.Policy{}, nil, fmt.Errorf("provider %s boots no release images: its nodes boot neither a release's node image nor an image a cloud keeps (docs/releases.md \"Cloud images\")", platform.Name())
	}
	images, ok := localPlatform().(provider.NodeImages)
	if !ok {
		return release.Policy{}, nil, errors.New("the catalog's local provider lays out no node images")
	}
	policy.CloudImageOf = platform.Name()
	return policy, images, nil
}

// upgrade moves an initialized cluster's nodes to the configured image, one node at a time,
// control planes first (docs/upgrades.md):
//
//  1. the release's reference set is added to the cluster's (old and new accepted) and to
//     the configuration, and apply waits until every join service admits by it;
//  2. for each node booting another image: a replacement booting the release is created; it
//     must attest against the release's set and be Ready before the old node is drained
//     (PodDisruptionBudgets respected) and removed as scale-down removes nodes;
//  3. once no node boots another image, every other set is retired, and the state records
//     the release.
//
// Each step is idempotent and derived from what the platform runs, so an interrupted upgrade
// resumes with apply. A replacement that fails attestation stops the upgrade: it is deleted,
// the release's set removed again, and the cluster keeps serving on the old nodes.
type upgrade struct {
	*reconciler
	workspace string
	conf      *config.Config
	// image is the node image every node must boot; release is its release, nil for a
	// plain image.
	image   string
	release *releasedir.Release
	// changed says whether the upgrade changed anything (apply says "nothing to apply"
	// otherwise).
	changed bool
	// verified are the nodes this apply verified as the release's (verifyRelease); created
	// the replacements it created.
	verified, created []string
	// verifyNode, if set, verifies nodes instead of verify's own client (tests).
	verifyNode verifyFunc
}

// replacementBound bounds the wait for one replacement node to be Ready.
const replacementBound = 10 * time.Minute

// check refuses, before apply changes anything, to move nodes to an image that is not a
// release, and to start an upgrade in a cluster that is not healthy. It returns the nodes that
// boot another image (staleNodes).
func (u *upgrade) check(ctx context.Context) ([]state.Node, error) {
	stale, err := u.staleNodes(ctx)
	if err != nil || len(stale) == 0 {
		return nil, err
	}
	if u.release == nil {
		if _, _, err := releaseRules(u.conf, "", false); err != nil {
			return nil, &release.Error{Reason: release.ReasonUnsigned, Err: fmt.Errorf(
				"%d node(s) boot another image than %s: replacing nodes needs a signed release, and %w: keep provider.%s.image as it was",
				len(stale), u.image, err, u.conf.Provider.Name())}
		}
		return nil, &release.Error{Reason: release.ReasonUnsigned, Err: fmt.Errorf(
			"%d node(s) boot another image than %s: replacing nodes needs a signed release (make release VERSION=...; provider.%s.image names its directory or URL)",
			len(stale), u.image, u.conf.Provider.Name())}
	}
	return stale, u.checkHealthy(ctx, stale)
}

// run carries out the upgrade that check allowed.
func (u *upgrade) run(ctx context.Context) error {
	stale, err := u.staleNodes(ctx)
	if err != nil {
		return err
	}
	if len(stale) == 0 {
		return u.finish(ctx)
	}
	if u.release == nil {
		return errors.New("nodes boot another image than the configured one, which is not a release") // check refused it
	}
	u.changed = true
	u.printPlan(stale)
	sets, err := u.addReleaseSets(ctx)
	if err != nil {
		return err
	}
	for {
		stale, err := u.staleNodes(ctx)
		if err != nil {
			return err
		}
		if len(stale) == 0 {
			break
		}
		if slices.Contains(u.created, stale[0].Name) {
			// Replacing it again would never end.
			return fmt.Errorf("%s, created by this upgrade to boot %s, is listed by the platform as booting another image: stopping instead of replacing it again (the platform names the image otherwise than provider.%s.image resolves it)",
				stale[0].Name, u.image, u.conf.Provider.Name())
		}
		if err := u.replace(ctx, stale[0], sets); err != nil {
			return err
		}
	}
	return u.finish(ctx)
}

// staleNodes are the nodes of the state file (not unexpected ones) whose machine boots
// another image than u.image: control planes first, then by name.
func (u *upgrade) staleNodes(ctx context.Context) ([]state.Node, error) {
	machines, err := u.platformNodes(ctx)
	if err != nil {
		return nil, err
	}
	images := map[string]string{}
	for _, m := range machines {
		images[m.Name] = m.Image
	}
	var stale []state.Node
	for _, n := range u.st.Nodes {
		if img, ok := images[n.Name]; ok && !n.Unexpected && img != u.image {
			stale = append(stale, n)
		}
	}
	slices.SortStableFunc(stale, func(a, b state.Node) int {
		if a.Role != b.Role {
			if a.Role == metadata.ControlPlane {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Name, b.Name)
	})
	return stale, nil
}

// checkHealthy refuses to start an upgrade in a cluster that is not whole: every node must be
// Ready. An upgrade that began (a node boots the release already) resumes regardless: it is
// how an upgrade interrupted by a lost node is finished.
func (u *upgrade) checkHealthy(ctx context.Context, stale []state.Node) error {
	if len(stale) < len(u.st.Nodes) {
		return nil
	}
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var problems []string
	err := retry.Do(lctx, retry.Default, nil, func(ctx context.Context) error {
		nodes, err := u.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		ready := map[string]bool{}
		problems = nil
		for _, n := range nodes.Items {
			ready[n.Name] = isReady(n) && !n.Spec.Unschedulable
			if err := kubernetesSkew(n.Status.NodeInfo.KubeletVersion, u.release.Manifest().KubernetesVersion); err != nil {
				problems = append(problems, n.Name+": "+err.Error())
			}
		}
		for _, n := range u.st.Nodes {
			if !n.Unexpected && !ready[n.Name] {
				problems = append(problems, n.Name+" is not Ready (or cordoned)")
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("checking the cluster's health before the upgrade: %w", err)
	}
	if len(problems) > 0 {
		return fmt.Errorf("refusing to start the upgrade to %s: the cluster is not healthy: %s (fix it, for example with 'constellation status' and 'constellation reboot', then apply again)",
			u.release.Version(), strings.Join(problems, "; "))
	}
	return nil
}

func (u *upgrade) printPlan(stale []state.Node) {
	m := u.release.Manifest()
	from := u.st.Release
	if from == "" {
		from = "an image that is not a release"
	}
	what := "upgrade"
	if u.release.Downgrade() {
		what = "DOWNGRADE (--allow-downgrade)"
	}
	fmt.Fprintf(u.out, "apply: %s from %s to release %s (Kubernetes %s, signed by %s); %d node(s) to replace, one at a time, control planes first:\n",
		what, from, m.Version, m.KubernetesVersion, u.release.KeyID(), len(stale))
	for _, n := range stale {
		fmt.Fprintf(u.out, "  ~ %s (%s): a new %s booting %s joins after attestation against set %q; then %s is drained and removed\n",
			n.Name, n.Role, n.Role, m.Version, m.Version, n.Name)
	}
}

// replace replaces node old by a node booting the release: a replacement of old's role is
// created unless one exists already (an interrupted apply made it), it must be Ready, then
// old is removed. sets are the names of the release's reference sets.
func (u *upgrade) replace(ctx context.Context, old state.Node, sets []string) error {
	have, want := 0, u.wantOf(old.Role)
	for _, n := range u.st.Nodes {
		if n.Role == old.Role && !n.Unexpected {
			have++
		}
	}
	if have <= want {
		prefix := "worker-"
		if old.Role == metadata.ControlPlane {
			prefix = "control-plane-"
		}
		further, err := u.furtherVersions(ctx)
		if err != nil {
			return err
		}
		spec := provider.NodeSpec{Name: fmt.Sprintf("%s%d", prefix, nextIndex(u.st, prefix)), Role: old.Role, Image: u.image, KubernetesVersions: further}
		fmt.Fprintf(u.out, "replacing %s: creating %s (release %s)\n", old.Name, spec.Name, u.release.Version())
		baseline := u.refusalBaseline(ctx)
		created := time.Now()
		if err := u.createNodes(ctx, []provider.NodeSpec{spec}); err != nil {
			return err
		}
		u.created = append(u.created, spec.Name)
		if err := u.waitReplacement(ctx, spec.Name, baseline, created); err != nil {
			return u.abort(ctx, spec.Name, err)
		}
		if err := u.verifyReplacement(ctx, spec.Name); err != nil {
			return u.abort(ctx, spec.Name, err)
		}
	}
	// Every node Ready before one is removed (the replacement, and one an interrupted apply
	// left joining).
	if err := u.waitAllReady(ctx, []state.Node{old}); err != nil {
		return err
	}
	if old.Role == metadata.ControlPlane {
		if err := u.waitControlPlaneVersion(ctx); err != nil {
			return err
		}
	}
	if err := u.remove(ctx, old); err != nil {
		return fmt.Errorf("removing %s, replaced by the release's node (apply again to finish; every step is idempotent): %w", old.Name, err)
	}
	return nil
}

func (u *upgrade) wantOf(role metadata.Role) int {
	lc := u.conf.Provider.Block()
	if role == metadata.ControlPlane {
		return lc.ControlPlanes
	}
	return lc.Workers
}

// refusalBaseline reads what the join services published before a replacement is created
// (refusalBaseline); one that cannot be read is empty: then only the time of a record tells
// whose refusals it holds.
func (u *upgrade) refusalBaseline(ctx context.Context) refusalBaseline {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	books, _ := refusals.Read(rctx, u.client)
	return newRefusalBaseline(books)
}

// waitReplacement waits until node is Ready and verifiable, and fails as soon as its
// refusals since it was created are definitive (refusalBaseline.since: definitiveStreak
// refusals in a row that trying again cannot change, on either side): every join service
// admits by the release's set already, so the refusal is the release's (its nodes do not
// measure what it signed, or do not trust the join services the cluster runs).
func (u *upgrade) waitReplacement(ctx context.Context, node string, baseline refusalBaseline, created time.Time) error {
	ctx, cancel := context.WithTimeoutCause(ctx, replacementBound, fmt.Errorf("%s was not Ready within %v", node, replacementBound))
	defer cancel()
	ip := ""
	for _, n := range u.st.Nodes {
		if n.Name == node && len(n.IPs) > 0 {
			ip = n.IPs[0].String()
		}
	}
	refused := make(chan error, 1)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		for {
			select {
			case <-wctx.Done():
				return
			case <-time.After(2 * time.Second):
			}
			books, _ := refusals.Read(wctx, u.client)
			if r, definitive := baseline.since(books, ip, created); definitive {
				refused <- refusedForGood(node, ip, r)
				stop()
				return
			}
		}
	}()
	err := waitNodesReady(wctx, u.out, u.t, u.prog, u.client, u.platform, u.st.Nodes, map[string]bool{node: true}, false)
	select {
	case rerr := <-refused:
		return rerr
	default:
	}
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("%w: %w", context.Cause(ctx), err)
	}
	return err
}

// verifyReplacement verifies node as `verify` does (fresh evidence from its verification
// service, checked against the configuration's reference sets, which hold the release's) and
// requires that it measures what one of the release's own sets says (verifyRelease).
func (u *upgrade) verifyReplacement(ctx context.Context, node string) error {
	verifier, err := u.verifier(ctx)
	if err != nil {
		return err
	}
	return u.verifyRelease(ctx, verifier, node)
}

// verifyRelease verifies node and requires that its verified registers match one of the
// release's own sets (measurements.ReferenceSets.Match, by value: whatever the set the
// verifier matched is named). The cluster may admit other images besides the release's (the
// old one, during a roll), and on a cloud nothing else ties the image a node boots to the
// release: whoever can write the cloud's image store can put another disk under the
// release's image. A node of the release that measures like another image is not the
// release's.
func (u *upgrade) verifyRelease(ctx context.Context, verifier verifyFunc, node string) error {
	i := slices.IndexFunc(u.st.Nodes, func(n state.Node) bool { return n.Name == node })
	if i < 0 {
		return fmt.Errorf("%s is not in %s", node, state.FileName)
	}
	target := verifyTarget{Node: node, Endpoint: net.JoinHostPort(u.st.Nodes[i].IPs[0].String(), strconv.Itoa(deploy.VerificationGRPCPort))}
	res, err := verifyWaiting(ctx, u.prog, target, time.Minute, verifier)
	if err != nil {
		return fmt.Errorf("verifying %s: %w", node, err)
	}
	presented := map[uint32][]byte{}
	for _, r := range res.Registers {
		if v, err := hex.DecodeString(r.Value); err == nil {
			presented[r.Index] = v
		}
	}
	match, err := u.releaseSets().Match(u.conf.Attestation.Variant(), presented)
	if err != nil {
		return fmt.Errorf("%s matched reference set %q, not one of release %s: its image is not what the release signed: %w", node, res.ReferenceSet, u.release.Version(), err)
	}
	u.t.phase("verified", fmt.Sprintf("%s matches release %s's reference set %q", node, u.release.Version(), match.Set))
	u.verified = append(u.verified, node)
	return nil
}

// verifyFunc verifies node's evidence from its verification service at endpoint, as
// `verify` does (verify.Verifier.Verify).
type verifyFunc func(ctx context.Context, node, endpoint string) (*verify.Result, error)

// verifier is verify's own, made from the configuration as it is now (it holds the release's
// sets once they were added), or u.verifyNode if set (tests).
func (u *upgrade) verifier(ctx context.Context) (verifyFunc, error) {
	if u.verifyNode != nil {
		return u.verifyNode, nil
	}
	v, err := newVerifier(ctx, u.workspace, u.conf, u.st)
	if err != nil {
		return nil, err
	}
	return v.Verify, nil
}

// verifyAllRelease verifies, before the release is recorded or any other set retired, that
// every node of the state file measures what the release signed (verifyRelease), but those
// this apply verified already: a replacement an interrupted apply created (and never
// verified), a node a scale-up of the same apply added, the nodes a cluster was created with
// from the release.
func (u *upgrade) verifyAllRelease(ctx context.Context) error {
	var verifier verifyFunc
	for _, n := range u.st.Nodes {
		if n.Unexpected || slices.Contains(u.verified, n.Name) {
			continue
		}
		if verifier == nil {
			v, err := u.verifier(ctx)
			if err != nil {
				return err
			}
			verifier = v
		}
		if err := u.verifyRelease(ctx, verifier, n.Name); err != nil {
			return fmt.Errorf("release %s is not recorded and no reference set retired: %w (find out what changed the image the node booted, replace the node, and apply again)", u.release.Version(), err)
		}
	}
	return nil
}

// abort undoes a failed replacement: the replacement is removed (it never served), the
// release's sets are retired, and the error says why the upgrade stopped.
func (u *upgrade) abort(ctx context.Context, node string, cause error) error {
	fmt.Fprintf(u.out, "upgrade to %s stopped: %v\n", u.release.Version(), cause)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Minute)
	defer cancel()
	var problems []error
	if i := slices.IndexFunc(u.st.Nodes, func(n state.Node) bool { return n.Name == node }); i >= 0 {
		if err := u.remove(cctx, u.st.Nodes[i]); err != nil {
			problems = append(problems, fmt.Errorf("removing %s: %w", node, err))
		}
	}
	if err := u.setReferenceSets(cctx, func(sets measurements.ReferenceSets) measurements.ReferenceSets {
		return slices.DeleteFunc(sets, func(s measurements.ReferenceSet) bool { return u.isReleaseSet(s.Name) })
	}); err != nil {
		problems = append(problems, fmt.Errorf("retiring the release's reference set: %w", err))
	}
	if len(problems) > 0 {
		return fmt.Errorf("upgrade to %s failed, and undoing its first step failed too (apply again): %w", u.release.Version(), errors.Join(append([]error{cause}, problems...)...))
	}
	return fmt.Errorf("upgrade to %s failed; the cluster still runs on its old nodes, and the release's reference set was retired again: %w", u.release.Version(), cause)
}

// servicesBound bounds the roll of the services to the release's image.
const servicesBound = 10 * time.Minute

// rollServices moves the join, key and verification services to the release's services image,
// once every node runs the release (its nodes carry the image; older nodes do not), one
// DaemonSet at a time (deploy.RollServices).
func (u *upgrade) rollServices(ctx context.Context) error {
	image := u.release.Manifest().ServicesImage.Ref
	ctx, cancel := context.WithTimeoutCause(ctx, servicesBound, fmt.Errorf("the services did not roll out %s within %v", image, servicesBound))
	defer cancel()
	u.prog.waiting("services", "the join, key and verification services to run "+image)
	changed, err := deploy.RollServices(ctx, u.client, image, func(step string) { u.prog.waiting("services", step) })
	if err != nil {
		u.prog.failed("services", err)
		return fmt.Errorf("rolling the services to release %s's image (apply again to go on): %w", u.release.Version(), err)
	}
	u.prog.done("services")
	if len(changed) > 0 {
		u.changed = true
		u.t.phase("services", fmt.Sprintf("%s run %s", strings.Join(changed, ", "), image))
	}
	return nil
}

// finish retires every reference set but the release's once no node boots another image,
// and records the release. Without a release (a plain image) there is nothing to retire.
func (u *upgrade) finish(ctx context.Context) error {
	if u.release == nil {
		return nil
	}
	if err := u.waitAddons(ctx); err != nil {
		return err
	}
	if err := u.rollServices(ctx); err != nil {
		return err
	}
	var retired []string
	for _, s := range u.conf.Attestation.Of(u.conf.Attestation.Variant()).Measurements {
		if !u.isReleaseSet(s.Name) {
			retired = append(retired, s.Name)
		}
	}
	if len(retired) > 0 || u.st.Release != u.release.Version() {
		if err := u.verifyAllRelease(ctx); err != nil {
			return err
		}
	}
	err := u.setReferenceSets(ctx, func(measurements.ReferenceSets) measurements.ReferenceSets { return u.releaseSets() })
	if err != nil {
		return fmt.Errorf("retiring the reference sets no node boots any more: %w", err)
	}
	if len(retired) > 0 {
		u.t.phase("retire", fmt.Sprintf("reference set(s) %s retired: every node boots release %s", strings.Join(retired, ", "), u.release.Version()))
	}
	if u.st.Release != u.release.Version() {
		u.changed = true
		u.st.Release = u.release.Version()
		if err := u.writeState(); err != nil {
			return err
		}
		fmt.Fprintf(u.out, "upgraded: every node boots release %s\n", u.release.Version())
	}
	return nil
}
