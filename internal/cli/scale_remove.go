package cli

import (
	"context"
	"errors"
	"io"

	"k8s.io/client-go/kubernetes"

	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/state"
)

// removeNode removes one node from the cluster.
func removeNode(ctx context.Context, out io.Writer, t *phaseTimer, client kubernetes.Interface, platform provider.Provider, st *state.State, n state.Node, o scaleOptions) error {
	return errors.New("removing nodes is not implemented yet")
}
