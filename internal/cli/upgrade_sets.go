package cli

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/openconstellation/constellation/internal/clusterrecord"
	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/deploy"
	"github.com/openconstellation/constellation/internal/joinservice/refusals"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/retry"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
)

// The reference sets of an upgrade (docs/upgrades.md "The roll"): the cluster's
// (ConfigMap constellation-attestation, which the join services admit by) and the
// configuration's (what verify and status check nodes against) change together, through
// one edit, so they never disagree for longer than between two writes of one apply.

// releaseSets are the release's reference sets of the cluster's variant.
func (u *upgrade) releaseSets() measurements.ReferenceSets {
	ref, _ := u.release.Reference(u.conf.Attestation.Variant()) // the policy required it
	return slices.Clone(ref.Measurements)
}

func (u *upgrade) isReleaseSet(name string) bool {
	return slices.ContainsFunc(u.releaseSets(), func(s measurements.ReferenceSet) bool { return s.Name == name })
}

// addReleaseSets adds the release's sets to the cluster's and the configuration's (a set of
// the same name is replaced by the release's signed one), then waits until every join service
// admits by them. It returns their names.
func (u *upgrade) addReleaseSets(ctx context.Context) ([]string, error) {
	add := u.releaseSets()
	err := u.setReferenceSets(ctx, func(sets measurements.ReferenceSets) measurements.ReferenceSets {
		sets = slices.DeleteFunc(sets, func(s measurements.ReferenceSet) bool { return u.isReleaseSet(s.Name) })
		return append(sets, add...)
	})
	if err != nil {
		return nil, fmt.Errorf("adding the release's reference set: %w", err)
	}
	var names []string
	for _, s := range add {
		names = append(names, s.Name)
	}
	if err := u.waitJoinServices(ctx, names); err != nil {
		return nil, err
	}
	return names, nil
}

// setReferenceSets applies edit to the cluster's reference sets, then to the
// configuration's. Each write happens only if it changes something, so it is idempotent.
func (u *upgrade) setReferenceSets(ctx context.Context, edit func(measurements.ReferenceSets) measurements.ReferenceSets) error {
	// A conflict (the ConfigMap written meanwhile) is read again and edited again.
	retryable := func(err error) bool { return retry.Transient(err) || apierrors.IsConflict(err) }
	err := retry.Do(ctx, retry.Default, retryable, func(ctx context.Context) error {
		cms := u.client.CoreV1().ConfigMaps(clusterrecord.Namespace)
		cm, err := cms.Get(ctx, clusterrecord.AttestationConfigMapName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		ref, err := clusterrecord.ParseAttestation([]byte(cm.Data[clusterrecord.VariantKey]), []byte(cm.Data[clusterrecord.ReferenceSetsKey]),
			[]byte(cm.Data[clusterrecord.AKRootsKey]), []byte(cm.Data[clusterrecord.HardwareKey]))
		if err != nil {
			return fmt.Errorf("the cluster's attestation record: %w", err)
		}
		ref.Measurements = edit(slices.Clone(ref.Measurements))
		data, err := clusterrecord.AttestationData(ref)
		if err != nil {
			return err
		}
		if cm.Data[clusterrecord.ReferenceSetsKey] == data[clusterrecord.ReferenceSetsKey] {
			return nil
		}
		cm.Data[clusterrecord.ReferenceSetsKey] = data[clusterrecord.ReferenceSetsKey]
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return err
	}
	vals := u.conf.Attestation.Of(u.conf.Attestation.Variant())
	edited := edit(slices.Clone(vals.Measurements))
	if setsEqual(edited, vals.Measurements) {
		return nil
	}
	vals.Measurements = edited
	if err := config.Write(filepath.Join(u.workspace, config.FileName), u.conf, true); err != nil {
		return fmt.Errorf("writing the reference sets into %s: %w", config.FileName, err)
	}
	var names []string
	for _, s := range edited {
		names = append(names, s.Name)
	}
	fmt.Fprintf(u.out, "reference sets of the cluster and of %s: %s\n", config.FileName, strings.Join(names, ", "))
	return nil
}

func setsEqual(a, b measurements.ReferenceSets) bool {
	ja, erra := json.Marshal(a)
	jb, errb := json.Marshal(b)
	return erra == nil && errb == nil && string(ja) == string(jb)
}

// waitJoinServices waits until the join service of every control plane publishes that it
// admits by every set of names (refusals.ReadReferenceSets). The services reload the sets
// when the kubelet updates their ConfigMap volume, which it does at its next sync of the pod:
// apply touches an annotation of each join-service pod so that the sync comes at once, not
// within the kubelet's sync period (a minute).
func (u *upgrade) waitJoinServices(ctx context.Context, names []string) error {
	ctx, cancel := context.WithTimeoutCause(ctx, 3*time.Minute, fmt.Errorf("the join services did not load reference set(s) %s within 3m", strings.Join(names, ", ")))
	defer cancel()
	u.nudgeJoinServices(ctx, names)
	var planes []string
	for _, n := range u.st.Nodes {
		if n.Role == metadata.ControlPlane && !n.Unexpected {
			planes = append(planes, n.Name)
		}
	}
	for _, p := range planes {
		u.prog.waiting(p, "its join service to admit by reference set(s) "+strings.Join(names, ", "))
	}
	for {
		published, err := refusals.ReadReferenceSets(ctx, u.client)
		missing := 0
		for _, p := range planes {
			if have := published[p]; !containsAll(have, names) {
				missing++
				if err != nil {
					u.prog.failed(p, err)
				}
				continue
			}
			u.prog.done(p)
		}
		if missing == 0 {
			u.t.phase("reference sets", fmt.Sprintf("every join service (%d) admits by %s", len(planes), strings.Join(names, ", ")))
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %s", context.Cause(ctx), u.prog.summary())
		case <-time.After(time.Second):
		}
	}
}

func containsAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

// nudgeJoinServices annotates every join-service pod with a digest of names: an update of a
// pod makes its kubelet sync it, which refreshes its ConfigMap volume. A failure only delays
// the reload to the kubelet's next periodic sync.
func (u *upgrade) nudgeJoinServices(ctx context.Context, names []string) {
	pods, err := u.client.CoreV1().Pods(clusterrecord.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + deploy.JoinService})
	if err != nil {
		return
	}
	sum := sha256.Sum256([]byte(strings.Join(names, "\n")))
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"%x"}}}`, referenceSetsAnnotation, sum[:8])
	for _, p := range pods.Items {
		_, _ = u.client.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	}
}

// referenceSetsAnnotation marks a join-service pod with the reference sets apply last asked
// it to load.
const referenceSetsAnnotation = "constellation.openconstellation.dev/reference-sets"
