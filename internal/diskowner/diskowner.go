// Package diskowner records which node a state disk belongs to, in the cluster: one
// immutable ConfigMap per disk in the namespace Namespace, named "disk-" + the disk's
// lower-case UUID, whose key "node" names the node. The join service writes a record when it
// issues a join ticket and reads it before it releases the disk's key again (rejoin); the
// init server writes the record of the first node's disk (that node never gets a join
// ticket). The CLI copies them (Records) into its state file while the cluster runs, for
// `constellation recover`, which runs when the cluster and its records are down. Design and
// reasons: docs/joinservice.md, "Keys follow identity".
//
// First writer wins: Claim creates the object, and the API server's create is atomic (a
// second create of the same name fails with AlreadyExists), so two nodes claiming one disk at
// once cannot both win. A record is never updated (the object is immutable, and the join
// service has no update or delete permission); an administrator who re-provisions a disk
// deletes its record.
package diskowner

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"

	"github.com/openconstellation/constellation/internal/untrusted"
)

// Namespace holds the records and nothing else, so that the join service's permission to
// create ConfigMaps (RBAC cannot restrict create by name) lets it plant nothing another
// component reads.
const Namespace = "constellation-disks"

// NodeKey is the ConfigMap key holding the owner's node name.
const NodeKey = "node"

// RecordKindLabel tells the kinds of records in Namespace apart: ComponentLabel (disk
// owners) or RemovedLabel (removed nodes). The admission policy that refuses removed nodes
// selects its parameters by it (internal/deploy).
const RecordKindLabel = "app.kubernetes.io/component"

// ComponentLabel marks the disk-owner records (RecordKindLabel).
const ComponentLabel = "disk-owner"

var uuidPattern = regexp.MustCompile(`\A[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\z`)

// ErrMalformedUUID is returned for a disk UUID that is not 8-4-4-4-12 hex digits.
var ErrMalformedUUID = errors.New("disk UUID is not of the form 8-4-4-4-12 hex digits")

// CanonicalUUID returns uuid in lower case, the form that names a disk's key and its record.
// The error does not quote uuid: it may be large and come from a peer.
func CanonicalUUID(uuid string) (string, error) {
	if !uuidPattern.MatchString(uuid) {
		return "", ErrMalformedUUID
	}
	return strings.ToLower(uuid), nil
}

// ObjectName is the name of the record of the disk uuid.
func ObjectName(uuid string) (string, error) {
	id, err := CanonicalUUID(uuid)
	if err != nil {
		return "", err
	}
	return "disk-" + id, nil
}

// ErrNoRecord is returned by Owner for a disk nobody has claimed.
var ErrNoRecord = errors.New("no owner recorded for the disk")

// Store reads and writes the records through the API server.
type Store struct {
	Client kubernetes.Interface
}

// Claim records node as the owner of disk uuid unless the disk is recorded already, and
// returns the recorded owner: node when this call or an earlier one of the same node won,
// another name when another node did. The caller decides; Claim never overwrites.
func (s Store) Claim(ctx context.Context, uuid, node string) (owner string, err error) {
	if errs := validation.IsDNS1123Subdomain(node); len(errs) > 0 {
		return "", fmt.Errorf("node name %s: %s", untrusted.Quote(node), strings.Join(errs, "; "))
	}
	name, err := ObjectName(uuid)
	if err != nil {
		return "", err
	}
	immutable := true
	_, err = s.Client.CoreV1().ConfigMaps(Namespace).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace, Labels: map[string]string{
			RecordKindLabel: ComponentLabel, "app.kubernetes.io/part-of": "constellation",
		}},
		Data:      map[string]string{NodeKey: node},
		Immutable: &immutable,
	}, metav1.CreateOptions{})
	switch {
	case err == nil:
		return node, nil
	case apierrors.IsAlreadyExists(err):
		return s.Owner(ctx, uuid)
	default:
		return "", fmt.Errorf("recording the owner of disk %s: %w", name, err)
	}
}

// Owner returns the node recorded for disk uuid, ErrNoRecord if there is none.
func (s Store) Owner(ctx context.Context, uuid string) (string, error) {
	name, err := ObjectName(uuid)
	if err != nil {
		return "", err
	}
	cm, err := s.Client.CoreV1().ConfigMaps(Namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", ErrNoRecord
	}
	if err != nil {
		return "", fmt.Errorf("reading the owner of disk %s: %w", name, err)
	}
	node := cm.Data[NodeKey]
	if errs := validation.IsDNS1123Subdomain(node); len(errs) > 0 {
		// Fail closed: a record that names no valid node releases the key to nobody.
		return "", fmt.Errorf("record %s/%s names no valid node (%s)", Namespace, name, untrusted.Quote(node))
	}
	return node, nil
}

// EnsureNamespace creates Namespace if it does not exist (init does, before it records the
// first node's disk; deploy applies it too).
func EnsureNamespace(ctx context.Context, client kubernetes.Interface) error {
	_, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{Name: Namespace, Labels: map[string]string{"app.kubernetes.io/part-of": "constellation"}},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", Namespace, err)
	}
	return nil
}

// Record is one disk-owner record: the disk (lower-case UUID) belongs to Node.
type Record struct {
	Disk string
	Node string
	// Created is when the record was written (the API server's creation timestamp).
	Created time.Time
}

// listPage bounds one list call; a cluster has one record per disk ever joined.
const listPage = 500

// Records lists every disk-owner record, ordered by disk. A record that the join service
// would not honour (a name that is not "disk-" and a lower-case UUID, or no valid node name)
// is not returned as a record but named in invalid: it releases a key to nobody, and a
// caller mirroring the records must not take an owner from it either. Listing needs the
// permission to list ConfigMaps in Namespace, which the join service does not have (the CLI
// reads them with the admin's credentials).
func (s Store) Records(ctx context.Context) (records []Record, invalid []error, err error) {
	opts := metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=" + ComponentLabel, Limit: listPage}
	for {
		list, err := s.Client.CoreV1().ConfigMaps(Namespace).List(ctx, opts)
		if err != nil {
			return nil, nil, fmt.Errorf("listing the disk-owner records in namespace %s: %w", Namespace, err)
		}
		for _, cm := range list.Items {
			id, ok := strings.CutPrefix(cm.Name, "disk-")
			if canonical, err := CanonicalUUID(id); !ok || err != nil || canonical != id {
				invalid = append(invalid, fmt.Errorf("record %s/%s: the name is not \"disk-\" and a lower-case UUID", Namespace, untrusted.Quote(cm.Name)))
				continue
			}
			node := cm.Data[NodeKey]
			if errs := validation.IsDNS1123Subdomain(node); len(errs) > 0 {
				invalid = append(invalid, fmt.Errorf("record %s/%s names no valid node (%s)", Namespace, cm.Name, untrusted.Quote(node)))
				continue
			}
			records = append(records, Record{Disk: id, Node: node, Created: cm.CreationTimestamp.Time})
		}
		if list.Continue == "" {
			break
		}
		opts.Continue = list.Continue
	}
	slices.SortFunc(records, func(a, b Record) int { return strings.Compare(a.Disk, b.Disk) })
	return records, invalid, nil
}
