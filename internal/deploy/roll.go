package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/openconstellation/constellation/internal/clusterrecord"
)

// services are the in-cluster services' DaemonSets and their containers of the services
// image, in the order a new services image rolls out: the key service before the join service
// that calls it, the verification service, then the encrypted-volume driver's controller
// (which a cluster deployed before the driver existed does not have: optional).
var services = []struct {
	daemonSet  string
	containers []string
	optional   bool
}{
	{KeyService, []string{"keyservice"}, false},
	{JoinService, []string{"joinservice"}, false},
	{VerificationService, []string{"verificationservice"}, false},
	{CSIController, csiContainers(), true},
}

// csiContainers are the containers of the CSI controller's pod, every one from the services
// image.
func csiContainers() []string {
	names := []string{"csidriver"}
	for _, s := range csiSidecars() {
		names = append(names, s.name)
	}
	return names
}

// RollServices moves the services to image (an upgrade's release brings its own:
// docs/upgrades.md "The services"), one DaemonSet at a time, each rolled out (every pod of the
// new image available, the DaemonSet's own rolling update: one node at a time) before the next
// starts. A DaemonSet that runs image already is left alone, so a rerun after an interruption
// goes on where it stopped. It reports each step to progress and returns the DaemonSets it
// changed; ctx bounds the whole roll.
func RollServices(ctx context.Context, client kubernetes.Interface, image string, progress func(string)) ([]string, error) {
	var changed []string
	for _, s := range services {
		ds, err := client.AppsV1().DaemonSets(clusterrecord.Namespace).Get(ctx, s.daemonSet, metav1.GetOptions{})
		if s.optional && apierrors.IsNotFound(err) {
			progress(fmt.Sprintf("%s: not deployed in this cluster, nothing to roll", s.daemonSet))
			continue
		}
		if err != nil {
			return changed, fmt.Errorf("DaemonSet %s/%s: %w", clusterrecord.Namespace, s.daemonSet, err)
		}
		// The image of the first container that does not run image yet, if any.
		current := image
		for _, c := range ds.Spec.Template.Spec.Containers {
			if slices.Contains(s.containers, c.Name) && c.Image != image {
				current = c.Image
				break
			}
		}
		if current != image {
			var containers []map[string]string
			for _, name := range s.containers {
				containers = append(containers, map[string]string{"name": name, "image": image})
			}
			patch, err := json.Marshal(map[string]any{"spec": map[string]any{"template": map[string]any{"spec": map[string]any{"containers": containers}}}})
			if err != nil {
				return changed, fmt.Errorf("DaemonSet %s/%s: %w", clusterrecord.Namespace, s.daemonSet, err)
			}
			if _, err := client.AppsV1().DaemonSets(clusterrecord.Namespace).Patch(ctx, s.daemonSet, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
				return changed, fmt.Errorf("DaemonSet %s/%s: setting image %s: %w", clusterrecord.Namespace, s.daemonSet, image, err)
			}
			changed = append(changed, s.daemonSet)
			progress(fmt.Sprintf("%s: rolling out %s (was %s)", s.daemonSet, image, current))
		}
		if err := waitRolledOut(ctx, client, s.daemonSet, progress); err != nil {
			return changed, err
		}
	}
	return changed, nil
}

// waitRolledOut waits until DaemonSet name is ready (daemonSetReady), reporting its state to
// progress when it changes.
func waitRolledOut(ctx context.Context, client kubernetes.Interface, name string, progress func(string)) error {
	ticker := time.NewTicker(time.Second)
	defer ticker.Stop()
	last := ""
	for {
		err := daemonSetReady(ctx, client, name)
		if err == nil {
			return nil
		}
		if err.Error() != last {
			last = err.Error()
			progress(last)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("rolling out %s: %w (last: %v)", name, context.Cause(ctx), err)
		case <-ticker.C:
		}
	}
}
