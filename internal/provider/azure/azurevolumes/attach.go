package azurevolumes

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v8"

	"github.com/openconstellation/constellation/internal/csidriver"
	"github.com/openconstellation/constellation/internal/provider/azure/azuremeta"
)

// Attach implements csidriver.Backing: the disk is added to the VM's data disks at the lowest
// free LUN. Azure itself refuses a disk another VM holds; the backing says which node first.
func (b *Backing) Attach(ctx context.Context, id, node string) error {
	unlock := b.lockVM(node)
	defer unlock()
	d, err := b.disk(ctx, id)
	if err != nil {
		return err
	}
	vm, err := b.vm(ctx, node)
	if err != nil {
		return err
	}
	if d.ManagedBy != nil && !strings.EqualFold(*d.ManagedBy, *vm.ID) {
		return &csidriver.AttachedElsewhereError{ID: id, Node: vmName(*d.ManagedBy)}
	}
	disks := vm.Properties.StorageProfile.DataDisks
	if _, ok := find(disks, *d.ID); ok {
		return nil
	}
	lun, err := freeLUN(disks)
	if err != nil {
		return fmt.Errorf("volume %s on node %s: %w", id, node, err)
	}
	disks = append(disks, &armcompute.DataDisk{
		Lun: &lun, Name: &id, CreateOption: ptr(armcompute.DiskCreateOptionTypesAttach),
		Caching: ptr(armcompute.CachingTypesNone), ManagedDisk: &armcompute.ManagedDiskParameters{ID: d.ID},
	})
	if err := b.setDataDisks(ctx, node, disks); err != nil {
		return fmt.Errorf("volume %s: attaching its disk to node %s at LUN %d: %w", id, node, lun, err)
	}
	return nil
}

// Detach implements csidriver.Backing: the disk leaves the VM's data disks.
func (b *Backing) Detach(ctx context.Context, id, node string) error {
	unlock := b.lockVM(node)
	defer unlock()
	d, err := b.disk(ctx, id)
	if errors.Is(err, csidriver.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	vm, err := b.vm(ctx, node)
	if errors.Is(err, csidriver.ErrNodeNotFound) {
		return nil // a deleted VM holds no disk
	}
	if err != nil {
		return err
	}
	disks := vm.Properties.StorageProfile.DataDisks
	i, ok := find(disks, *d.ID)
	if !ok {
		return nil
	}
	if *disks[i].Lun < azuremeta.FirstVolumeLUN {
		return fmt.Errorf("volume %s: its disk is node %s's state disk (LUN %d): refusing to detach it", id, node, *disks[i].Lun)
	}
	rest := append(append([]*armcompute.DataDisk{}, disks[:i]...), disks[i+1:]...)
	if err := b.setDataDisks(ctx, node, rest); err != nil {
		return fmt.Errorf("volume %s: detaching its disk from node %s: %w", id, node, err)
	}
	return nil
}

// vm reads a node's VM: ErrNodeNotFound if there is none or it is not the cluster's.
func (b *Backing) vm(ctx context.Context, node string) (armcompute.VirtualMachine, error) {
	resp, err := b.vms.Get(ctx, b.cfg.ResourceGroup, node, nil)
	if isNotFound(err) {
		return armcompute.VirtualMachine{}, fmt.Errorf("node %s: no VM: %w", node, csidriver.ErrNodeNotFound)
	}
	if err != nil {
		return armcompute.VirtualMachine{}, fmt.Errorf("node %s: reading its VM: %w", node, err)
	}
	vm := resp.VirtualMachine
	if tag(vm.Tags, azuremeta.TagUID) != b.cfg.UID {
		return armcompute.VirtualMachine{}, fmt.Errorf("node %s: the VM of that name is not this cluster's (tag %s=%q): %w",
			node, azuremeta.TagUID, tag(vm.Tags, azuremeta.TagUID), csidriver.ErrNodeNotFound)
	}
	if vm.ID == nil || vm.Properties == nil || vm.Properties.StorageProfile == nil {
		return armcompute.VirtualMachine{}, fmt.Errorf("node %s: its VM has no storage profile", node)
	}
	return vm, nil
}

// setDataDisks writes a VM's whole data disk list (a PATCH replaces the list it names).
func (b *Backing) setDataDisks(ctx context.Context, node string, disks []*armcompute.DataDisk) error {
	if disks == nil {
		disks = []*armcompute.DataDisk{} // an empty list, not an absent one
	}
	update := armcompute.VirtualMachineUpdate{Properties: &armcompute.VirtualMachineProperties{
		StorageProfile: &armcompute.StorageProfile{DataDisks: disks},
	}}
	poller, err := b.vms.BeginUpdate(ctx, b.cfg.ResourceGroup, node, update, nil)
	if err != nil {
		return err
	}
	_, err = poller.PollUntilDone(ctx, b.poll())
	return err
}

// lockVM serializes the changes of one VM's data disks.
func (b *Backing) lockVM(node string) func() {
	b.mu.Lock()
	m, ok := b.perVM[node]
	if !ok {
		m = &sync.Mutex{}
		b.perVM[node] = m
	}
	b.mu.Unlock()
	m.Lock()
	return m.Unlock
}

// find returns the index of the data disk whose managed disk is id.
func find(disks []*armcompute.DataDisk, id string) (int, bool) {
	for i, d := range disks {
		if d.ManagedDisk != nil && d.ManagedDisk.ID != nil && strings.EqualFold(*d.ManagedDisk.ID, id) {
			return i, true
		}
	}
	return 0, false
}

// freeLUN is the lowest LUN from azuremeta.FirstVolumeLUN no data disk takes.
func freeLUN(disks []*armcompute.DataDisk) (int32, error) {
	used := map[int32]bool{}
	for _, d := range disks {
		if d.Lun != nil {
			used[*d.Lun] = true
		}
	}
	for lun := int32(azuremeta.FirstVolumeLUN); lun <= azuremeta.MaxLUN; lun++ {
		if !used[lun] {
			return lun, nil
		}
	}
	return 0, fmt.Errorf("every LUN %d-%d is taken: detach a volume from the node first", azuremeta.FirstVolumeLUN, azuremeta.MaxLUN)
}
