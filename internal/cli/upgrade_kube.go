package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/openconstellation/constellation/internal/kube/kubeupgrade"
)

// What an upgrade does about the Kubernetes version (docs/upgrades.md "Kubernetes upgrades").
// The control planes move the version themselves (internal/kube/kubeupgrade): the first
// control plane of a release with a newer version upgrades the control plane with its own
// kubeadm, and once every node runs the version, the add-ons. apply gives the replacements the
// images of the versions the cluster still runs, and waits for each move before the step that
// needs it.

// kubernetesBound bounds each wait for a move of the Kubernetes version.
const kubernetesBound = 10 * time.Minute

// furtherVersions returns the Kubernetes versions the cluster runs besides the release's: a
// replacement joins a cluster whose control plane, add-ons or other nodes may run them, so it
// must be able to run their images (provider.NodeSpec.KubernetesVersions).
func (u *upgrade) furtherVersions(ctx context.Context) ([]string, error) {
	o, err := kubeupgrade.Observe(ctx, u.client)
	if err != nil {
		return nil, fmt.Errorf("reading the cluster's Kubernetes versions: %w", err)
	}
	return o.Others(u.release.Manifest().KubernetesVersion), nil
}

// waitControlPlaneVersion waits until the cluster's control plane runs the release's
// Kubernetes version, before an old control plane goes: the replacement's kubeadm upgrades the
// control plane after joining, and it must not lose the old member of etcd meanwhile.
func (u *upgrade) waitControlPlaneVersion(ctx context.Context) error {
	want := u.release.Manifest().KubernetesVersion
	return u.waitKubernetes(ctx, "control plane", "Kubernetes "+want, func(ctx context.Context) (bool, string, error) {
		v, err := kubeupgrade.ClusterVersion(ctx, u.client)
		if err != nil || v == want {
			return v == want, "", err
		}
		return false, fmt.Sprintf("runs %s; the new control plane's kubeadm upgrades it", v), nil
	})
}

// waitAddons waits until kube-proxy and CoreDNS run the release's Kubernetes version: a
// control plane upgrades them once every node runs it.
func (u *upgrade) waitAddons(ctx context.Context) error {
	want := u.release.Manifest().KubernetesVersion
	return u.waitKubernetes(ctx, "add-ons", "kube-proxy and CoreDNS of Kubernetes "+want, func(ctx context.Context) (bool, string, error) {
		return kubeupgrade.AddonsAt(ctx, u.client, want)
	})
}

// waitKubernetes polls done every 2 s until it holds, reporting what as the wait of who.
func (u *upgrade) waitKubernetes(ctx context.Context, who, what string, done func(context.Context) (bool, string, error)) error {
	ctx, cancel := context.WithTimeoutCause(ctx, kubernetesBound, fmt.Errorf("the %s did not run %s within %v", who, what, kubernetesBound))
	defer cancel()
	u.prog.waiting(who, what)
	for {
		ok, status, err := done(ctx)
		switch {
		case err != nil:
			u.prog.failed(who, err)
		case ok:
			u.prog.done(who)
			u.t.phase("kubernetes", fmt.Sprintf("the %s runs %s", who, what))
			return nil
		default:
			u.prog.waiting(who, what+" ("+status+")")
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %s", context.Cause(ctx), u.prog.summary())
		case <-time.After(2 * time.Second):
		}
	}
}
