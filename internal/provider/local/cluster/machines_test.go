package cluster

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A spec names its machines: sandboxes by default, a registered kind otherwise, and a kind
// this program does not have is an error naming it, never sandboxes in its place.
func TestMachinesOf(t *testing.T) {
	got, err := machinesOf(Spec{})
	require.NoError(t, err)
	assert.NotNil(t, got)

	_, err = machinesOf(Spec{Machines: "nope"})
	assert.ErrorContains(t, err, `the cluster's machines are "nope", which this program does not run`)

	var shape json.RawMessage
	RegisterMachines("test-kind", func(raw json.RawMessage) (NewMachines, error) {
		shape = raw
		return Sandboxes, nil
	})
	got, err = machinesOf(Spec{Machines: "test-kind", MachineShape: json.RawMessage(`{"cpus":2}`)})
	require.NoError(t, err)
	assert.NotNil(t, got)
	assert.JSONEq(t, `{"cpus":2}`, string(shape))
}
