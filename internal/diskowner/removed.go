package diskowner

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/openconstellation/constellation/internal/untrusted"
)

// RemovedLabel marks the records of removed nodes (RecordKindLabel).
const RemovedLabel = "removed-node"

// RemovedAtKey is the record key holding when the node was removed (RFC 3339).
const RemovedAtKey = "removedAt"

// RemovedObjectName is the name of the record that node was removed from the cluster.
func RemovedObjectName(node string) string { return "removed-" + node }

// MarkRemoved records that node was removed from the cluster (scaled down): from then on the
// join service refuses it, whatever the platform says. The platform stops listing a deleted
// machine too, but a platform may give a name out again (an autoscaler, a re-created VM):
// the record keeps a removed identity refused, and with it the disks it owned. The CLI
// writes it with the admin's credentials; it is immutable, and a second mark is not an
// error.
func (s Store) MarkRemoved(ctx context.Context, node string, at time.Time) error {
	if errs := validation.IsDNS1123Subdomain(RemovedObjectName(node)); len(errs) > 0 {
		return fmt.Errorf("node name %s: %s", untrusted.Quote(node), strings.Join(errs, "; "))
	}
	immutable := true
	_, err := s.Client.CoreV1().ConfigMaps(Namespace).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: RemovedObjectName(node), Namespace: Namespace, Labels: map[string]string{
			RecordKindLabel: RemovedLabel, "app.kubernetes.io/part-of": "constellation",
		}},
		Data:      map[string]string{NodeKey: node, RemovedAtKey: at.UTC().Format(time.RFC3339)},
		Immutable: &immutable,
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("recording that %s was removed: %w", node, err)
	}
	return nil
}

// Removed reports whether node was removed from the cluster. An error reading the record is
// returned as such: the caller fails closed.
func (s Store) Removed(ctx context.Context, node string) (bool, error) {
	if errs := validation.IsDNS1123Subdomain(RemovedObjectName(node)); len(errs) > 0 {
		return false, fmt.Errorf("node name %s: %s", untrusted.Quote(node), strings.Join(errs, "; "))
	}
	_, err := s.Client.CoreV1().ConfigMaps(Namespace).Get(ctx, RemovedObjectName(node), metav1.GetOptions{})
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsNotFound(err):
		return false, nil
	default:
		return false, fmt.Errorf("reading whether %s was removed: %w", node, err)
	}
}
