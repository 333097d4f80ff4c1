package azurenode

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/csidriver"
	"github.com/openconstellation/constellation/internal/provider/azure/azuremeta"
)

// imdsAnswers answers IMDS's instance query from a list of data disks the test changes.
type imdsAnswers struct {
	mu    sync.Mutex
	disks []azuremeta.DataDisk
	err   error
}

func (a *imdsAnswers) Instance(context.Context) (azuremeta.Instance, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return azuremeta.Instance{Name: "worker-0", DataDisks: append([]azuremeta.DataDisk(nil), a.disks...)}, a.err
}

func (a *imdsAnswers) set(disks ...azuremeta.DataDisk) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.disks, a.err = disks, nil
}

func TestLUNDisks(t *testing.T) {
	const dataCtrl = "00000000-0001-8899-0000-000000000000"
	vol, other := csidriver.IDFor("pvc-1"), csidriver.IDFor("pvc-2")
	f := fakeSysfs{root: t.TempDir()}
	f.disk(t, "sdc", dataCtrl, "1:0:0:0") // the state disk
	f.disk(t, "sdd", dataCtrl, "1:0:0:1")
	state := azuremeta.DataDisk{Name: "worker-0-state", LUN: 0}
	imds := &imdsAnswers{}
	d := &lunDisks{imds: imds, sysBlock: filepath.Join(f.root, "block"), wait: 100 * time.Millisecond, log: slog.Default()}

	imds.set(state, azuremeta.DataDisk{Name: vol, LUN: 1})
	dev, err := d.Device(t.Context(), vol)
	require.NoError(t, err)
	assert.Equal(t, "/dev/sdd", dev)

	testCases := map[string]struct {
		disks   []azuremeta.DataDisk
		id      string
		wantErr string
		is      error
	}{
		"not listed":                {disks: []azuremeta.DataDisk{state}, id: vol, wantErr: "IMDS lists no data disk of that name", is: csidriver.ErrNotAttached},
		"listed, no disk answers":   {disks: []azuremeta.DataDisk{state, {Name: other, LUN: 5}}, id: other, wantErr: "LUN 5: no data disk at the LUN", is: ErrNoLUN},
		"pointed at the state disk": {disks: []azuremeta.DataDisk{{Name: vol, LUN: 0}}, id: vol, wantErr: "IMDS lists it at LUN 0, the state disk's: refusing it"},
		"not a volume id":           {disks: []azuremeta.DataDisk{state}, id: "worker-0-state", wantErr: "not a volume id", is: csidriver.ErrNotAttached},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			imds.set(tc.disks...)
			_, err := d.Device(t.Context(), tc.id)
			assert.ErrorContains(t, err, tc.wantErr)
			if tc.is != nil {
				assert.ErrorIs(t, err, tc.is)
			}
		})
	}

	// IMDS lags the attach: the node waits for the disk to be listed.
	imds.set(state)
	d.wait = 5 * time.Second
	go func() {
		time.Sleep(300 * time.Millisecond)
		imds.set(state, azuremeta.DataDisk{Name: vol, LUN: 1})
	}()
	dev, err = d.Device(t.Context(), vol)
	require.NoError(t, err)
	assert.Equal(t, "/dev/sdd", dev)

	// IMDS down for longer than the wait: its error is the answer.
	imds.mu.Lock()
	imds.err = errors.New("asking IMDS about the VM: connection refused")
	imds.mu.Unlock()
	d.wait = 50 * time.Millisecond
	_, err = d.Device(t.Context(), vol)
	assert.ErrorContains(t, err, "connection refused")
}
