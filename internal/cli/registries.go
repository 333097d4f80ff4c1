package cli

import (
	"context"
	"fmt"
	"io"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/openconstellation/constellation/internal/clusterrecord"
	"github.com/openconstellation/constellation/internal/config"
	"github.com/openconstellation/constellation/internal/deploy"
	"github.com/openconstellation/constellation/internal/registries"
)

// syncRegistryMirrors records the configuration's registry mirrors in ConfigMap
// kube-system/constellation-registries when they differ from what the cluster records, and
// reports whether it changed anything. The join service puts the record into every ticket, so
// a joining node gets the new mirrors at once and a running node at its next reboot.
func syncRegistryMirrors(ctx context.Context, out io.Writer, client kubernetes.Interface, conf *config.Config) (bool, error) {
	cm, err := client.CoreV1().ConfigMaps(clusterrecord.Namespace).Get(ctx, clusterrecord.RegistriesConfigMapName, metav1.GetOptions{})
	var recorded registries.Mirrors
	switch {
	case apierrors.IsNotFound(err):
		// A cluster deployed before registry mirrors: none recorded.
	case err != nil:
		return false, fmt.Errorf("reading the cluster's registry mirrors: %w", err)
	default:
		if recorded, err = registries.Parse([]byte(cm.Data[clusterrecord.RegistryMirrorsKey])); err != nil {
			return false, fmt.Errorf("the cluster's registry mirrors (ConfigMap %s/%s): %w", clusterrecord.Namespace, clusterrecord.RegistriesConfigMapName, err)
		}
	}
	if registries.Equal(recorded, conf.RegistryMirrors) {
		return false, nil
	}
	encoded, err := conf.RegistryMirrors.Encode()
	if err != nil {
		return false, fmt.Errorf("registryMirrors: %w", err)
	}
	if _, err := client.CoreV1().ConfigMaps(clusterrecord.Namespace).Apply(ctx, deploy.RegistriesConfigMap(string(encoded)),
		metav1.ApplyOptions{FieldManager: deploy.FieldManager, Force: true}); err != nil {
		return false, fmt.Errorf("recording the registry mirrors: %w", err)
	}
	hosts := "none"
	if len(conf.RegistryMirrors) > 0 {
		hosts = strings.Join(conf.RegistryMirrors.Hosts(), ", ")
	}
	fmt.Fprintf(out, "registry mirrors recorded (%s): joining nodes use them now, running nodes from their next reboot\n", hosts)
	return true, nil
}
