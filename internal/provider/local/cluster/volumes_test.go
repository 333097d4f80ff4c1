package cluster

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/csidriver"
	"github.com/openconstellation/constellation/internal/provider/local/volumestore"
)

// fakeDisks records what is plugged where.
type fakeDisks struct {
	plugged   map[string]string // id -> node
	unplugErr error
}

func (f *fakeDisks) PlugVolume(_ context.Context, node, id, _ string) error {
	f.plugged[id] = node
	return nil
}

func (f *fakeDisks) UnplugVolume(_ context.Context, node, id string) error {
	if f.unplugErr != nil {
		return f.unplugErr
	}
	if f.plugged[id] == node {
		delete(f.plugged, id)
	}
	return nil
}

// The disk follows the store's record: plugged only into the node that holds the volume,
// when it looks it up; unplugged before the attachment is released, which stays when the
// unplug fails.
func TestPluggedVolumes(t *testing.T) {
	ctx := context.Background()
	store, err := volumestore.Open(t.TempDir())
	require.NoError(t, err)
	disks := &fakeDisks{plugged: map[string]string{}}
	v := &pluggedVolumes{Store: store, disks: disks}
	id := csidriver.IDFor("pvc-a")
	_, err = v.Create(ctx, id, 64<<20)
	require.NoError(t, err)
	require.NoError(t, v.Attach(ctx, id, "worker-0"))
	assert.Empty(t, disks.plugged, "attaching records; the disk is plugged when the node looks")

	_, err = v.Path(ctx, id, "worker-1")
	assert.ErrorIs(t, err, csidriver.ErrNotAttached)
	assert.Empty(t, disks.plugged, "another node's lookup plugs nothing")
	file, err := v.Path(ctx, id, "worker-0")
	require.NoError(t, err)
	assert.Equal(t, id+".img", file[len(file)-len(id)-4:])
	assert.Equal(t, map[string]string{id: "worker-0"}, disks.plugged)

	disks.unplugErr = errors.New("QEMU's monitor: busy")
	assert.ErrorContains(t, v.Detach(ctx, id, "worker-0"), "busy")
	vol, err := v.Get(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, "worker-0", vol.AttachedTo, "a disk still plugged keeps its volume attached")

	disks.unplugErr = nil
	require.NoError(t, v.Detach(ctx, id, "worker-0"))
	assert.Empty(t, disks.plugged)
	vol, err = v.Get(ctx, id)
	require.NoError(t, err)
	assert.Empty(t, vol.AttachedTo)
	require.NoError(t, v.Attach(ctx, id, "worker-1"), "released: another node may take it")
}
