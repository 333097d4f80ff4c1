package azuresim

import (
	"context"
	"strings"

	azfake "github.com/Azure/azure-sdk-for-go/sdk/azcore/fake"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v8"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v7"
)

func (c *Cloud) serveCompute() {
	c.serveDisks()
	c.serveVMs()
	c.serveVMPower()
}

func (c *Cloud) serveDisks() {
	s := &c.compute.DisksServer
	const typ = "Microsoft.Compute/disks"
	tbl := func(g *group) map[string]*armcompute.Disk { return g.disks }
	s.Get = func(_ context.Context, rg, name string, _ *armcompute.DisksClientGetOptions) (azfake.Responder[armcompute.DisksClientGetResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		v, err := find(c, rg, name, tbl)
		return respond(armcompute.DisksClientGetResponse{Disk: deref(v)}, err)
	}
	s.BeginCreateOrUpdate = func(_ context.Context, rg, name string, d armcompute.Disk, _ *armcompute.DisksClientBeginCreateOrUpdateOptions) (azfake.PollerResponder[armcompute.DisksClientCreateOrUpdateResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		d.ID, d.Name = ptr(c.id(rg, typ, name)), ptr(name)
		upload := d.Properties != nil && d.Properties.CreationData != nil && d.Properties.CreationData.CreateOption != nil &&
			*d.Properties.CreationData.CreateOption == armcompute.DiskCreateOptionUpload
		if d.Properties == nil || d.Properties.CreationData == nil || (!upload && (d.Properties.DiskSizeGB == nil || *d.Properties.DiskSizeGB <= 0)) {
			return lro(c, "DisksClient.BeginCreateOrUpdate", armcompute.DisksClientCreateOrUpdateResponse{}, badRequest("InvalidParameter"), nil)
		}
		if old, err := find(c, rg, name, tbl); err == nil && !upload {
			if *old.Properties.DiskSizeGB > *d.Properties.DiskSizeGB {
				return lro(c, "DisksClient.BeginCreateOrUpdate", armcompute.DisksClientCreateOrUpdateResponse{}, badRequest("DiskSizeDecreaseNotAllowed"), nil)
			}
			d.ManagedBy = old.ManagedBy
		}
		d.Properties.DiskState = ptr(armcompute.DiskStateUnattached)
		if co := d.Properties.CreationData.CreateOption; co != nil && *co == armcompute.DiskCreateOptionUpload {
			if d.Properties.CreationData.UploadSizeBytes == nil || (*d.Properties.CreationData.UploadSizeBytes-512)%(1<<20) != 0 {
				return lro(c, "DisksClient.BeginCreateOrUpdate", armcompute.DisksClientCreateOrUpdateResponse{}, badRequest("InvalidUploadSize"), nil)
			}
			d.Properties.DiskState = ptr(armcompute.DiskStateReadyToUpload)
		}
		if d.ManagedBy != nil {
			d.Properties.DiskState = ptr(armcompute.DiskStateAttached)
		}
		stored, err := store(c, rg, name, &d, tbl)
		return lro(c, "DisksClient.BeginCreateOrUpdate", armcompute.DisksClientCreateOrUpdateResponse{Disk: deref(stored)}, err, nil)
	}
	// Update (PATCH) grows a disk; it never shrinks one.
	s.BeginUpdate = func(_ context.Context, rg, name string, u armcompute.DiskUpdate, _ *armcompute.DisksClientBeginUpdateOptions) (azfake.PollerResponder[armcompute.DisksClientUpdateResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		const api = "DisksClient.BeginUpdate"
		d, err := find(c, rg, name, tbl)
		if err != nil {
			return lro(c, api, armcompute.DisksClientUpdateResponse{}, err, nil)
		}
		if u.Properties != nil && u.Properties.DiskSizeGB != nil {
			if *u.Properties.DiskSizeGB < *d.Properties.DiskSizeGB {
				return lro(c, api, armcompute.DisksClientUpdateResponse{}, badRequest("DiskSizeDecreaseNotAllowed"), nil)
			}
			d.Properties.DiskSizeGB = u.Properties.DiskSizeGB
		}
		stored, err := store(c, rg, name, d, tbl)
		return lro(c, api, armcompute.DisksClientUpdateResponse{Disk: deref(stored)}, err, nil)
	}
	s.BeginDelete = func(_ context.Context, rg, name string, _ *armcompute.DisksClientBeginDeleteOptions) (azfake.PollerResponder[armcompute.DisksClientDeleteResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		d, err := find(c, rg, name, tbl)
		if err == nil && d.ManagedBy != nil {
			err = conflict("OperationNotAllowed") // "Disk is attached to VM"
		}
		if err == nil && d.Properties.DiskState != nil && *d.Properties.DiskState == armcompute.DiskStateActiveUpload {
			err = conflict("OperationNotAllowed") // write access must be revoked first
		}
		if err == nil {
			err = drop(c, rg, name, tbl)
		}
		return lro(c, "DisksClient.BeginDelete", armcompute.DisksClientDeleteResponse{}, err, nil)
	}
}

func (c *Cloud) serveVMs() {
	s := &c.compute.VirtualMachinesServer
	s.Get = func(_ context.Context, rg, name string, _ *armcompute.VirtualMachinesClientGetOptions) (azfake.Responder[armcompute.VirtualMachinesClientGetResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		v, err := find(c, rg, name, func(g *group) map[string]*vm { return g.vms })
		var out armcompute.VirtualMachine
		if v != nil {
			out = v.VirtualMachine
		}
		return respond(armcompute.VirtualMachinesClientGetResponse{VirtualMachine: out}, err)
	}
	s.NewListPager = func(rg string, _ *armcompute.VirtualMachinesClientListOptions) (resp azfake.PagerResponder[armcompute.VirtualMachinesClientListResponse]) {
		c.mu.Lock()
		defer c.mu.Unlock()
		g, err := c.groupOf(rg)
		if err != nil {
			resp.AddResponseError(err.status, err.code)
			return
		}
		var list []*armcompute.VirtualMachine
		for _, v := range g.vms {
			list = append(list, &clone(v).VirtualMachine)
		}
		resp.AddPage(200, armcompute.VirtualMachinesClientListResponse{VirtualMachineListResult: armcompute.VirtualMachineListResult{Value: list}}, nil)
		return
	}
	s.BeginCreateOrUpdate = func(_ context.Context, rg, name string, v armcompute.VirtualMachine, _ *armcompute.VirtualMachinesClientBeginCreateOrUpdateOptions) (azfake.PollerResponder[armcompute.VirtualMachinesClientCreateOrUpdateResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		const api = "VirtualMachinesClient.BeginCreateOrUpdate"
		out, err := c.createVM(rg, name, v)
		return lro(c, api, armcompute.VirtualMachinesClientCreateOrUpdateResponse{VirtualMachine: out}, err, func() {
			if g, err := c.groupOf(rg); err == nil && g.vms[key(name)] != nil {
				g.vms[key(name)].Properties.ProvisioningState = ptr("Failed")
				g.vms[key(name)].power = "stopped"
				c.stopped(rg, name)
			}
		})
	}
	// Update (PATCH) takes the data disks (what the volume driver changes) and the tags (the
	// host half's record of a boot it asked for). Azure replaces an array or the tags a PATCH
	// names, so the list is the VM's whole list.
	s.BeginUpdate = func(_ context.Context, rg, name string, u armcompute.VirtualMachineUpdate, _ *armcompute.VirtualMachinesClientBeginUpdateOptions) (azfake.PollerResponder[armcompute.VirtualMachinesClientUpdateResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		const api = "VirtualMachinesClient.BeginUpdate"
		v, err := find(c, rg, name, func(g *group) map[string]*vm { return g.vms })
		if err != nil {
			return lro(c, api, armcompute.VirtualMachinesClientUpdateResponse{}, err, nil)
		}
		disks := u.Properties != nil && u.Properties.StorageProfile != nil && u.Properties.StorageProfile.DataDisks != nil
		if !disks && u.Tags == nil {
			return lro(c, api, armcompute.VirtualMachinesClientUpdateResponse{}, badRequest("PropertyChangeNotAllowed"), nil)
		}
		next := clone(v).VirtualMachine
		if disks {
			next.Properties.StorageProfile.DataDisks = u.Properties.StorageProfile.DataDisks
		}
		if u.Tags != nil {
			next.Tags = u.Tags
		}
		out, err := c.createVM(rg, name, next)
		return lro(c, api, armcompute.VirtualMachinesClientUpdateResponse{VirtualMachine: out}, err, nil)
	}
	s.BeginDelete = func(_ context.Context, rg, name string, _ *armcompute.VirtualMachinesClientBeginDeleteOptions) (azfake.PollerResponder[armcompute.VirtualMachinesClientDeleteResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		return lro(c, "VirtualMachinesClient.BeginDelete", armcompute.VirtualMachinesClientDeleteResponse{}, c.deleteVM(rg, name), nil)
	}
}

// createVM checks and stores a VM (a PUT of an existing VM updates it) and starts it.
// Called with c.mu held.
func (c *Cloud) createVM(rg, name string, v armcompute.VirtualMachine) (armcompute.VirtualMachine, *apiError) {
	g, err := c.groupOf(rg)
	if err != nil {
		return armcompute.VirtualMachine{}, err
	}
	id := c.id(rg, "Microsoft.Compute/virtualMachines", name)
	v.ID, v.Name = ptr(id), ptr(name)
	if err := checkConfidential(v); err != nil {
		return armcompute.VirtualMachine{}, err
	}
	p := v.Properties
	for _, nic := range p.NetworkProfile.NetworkInterfaces {
		n, err := c.lookup(*nic.ID)
		if err != nil {
			return armcompute.VirtualMachine{}, badRequest("InvalidResourceReference")
		}
		if np := n.(*armnetwork.Interface).Properties; np != nil && np.VirtualMachine != nil && !strings.EqualFold(*np.VirtualMachine.ID, id) {
			return armcompute.VirtualMachine{}, conflict("NicInUse")
		}
	}
	if err := c.checkDataDisks(p.StorageProfile.DataDisks); err != nil {
		return armcompute.VirtualMachine{}, err
	}
	for _, d := range p.StorageProfile.DataDisks {
		if d.ManagedDisk == nil || d.ManagedDisk.ID == nil {
			continue
		}
		disk, err := c.lookup(*d.ManagedDisk.ID)
		if err != nil {
			return armcompute.VirtualMachine{}, notFound("NotFound")
		}
		if by := disk.(*armcompute.Disk).ManagedBy; by != nil && !strings.EqualFold(*by, id) {
			return armcompute.VirtualMachine{}, conflict("OperationNotAllowed") // attached elsewhere
		}
	}
	for ident := range v.Identity.UserAssignedIdentities {
		if _, err := c.lookup(ident); err != nil {
			return armcompute.VirtualMachine{}, badRequest("FailedIdentityOperation")
		}
	}
	p.ProvisioningState = ptr("Succeeded")
	if ref := p.StorageProfile.ImageReference; c.imageCase != nil && ref != nil && ref.ID != nil {
		ref.ID = ptr(c.imageCase(*ref.ID))
	}
	for _, nic := range p.NetworkProfile.NetworkInterfaces {
		n, _ := c.lookup(*nic.ID)
		n.(*armnetwork.Interface).Properties.VirtualMachine = &armnetwork.SubResource{ID: ptr(id)}
	}
	for _, d := range p.StorageProfile.DataDisks {
		if d.ManagedDisk != nil && d.ManagedDisk.ID != nil {
			disk, _ := c.lookup(*d.ManagedDisk.ID)
			if d.Name == nil {
				d.Name = disk.(*armcompute.Disk).Name // Azure names a data disk by its disk
			}
			disk.(*armcompute.Disk).ManagedBy = ptr(id)
			disk.(*armcompute.Disk).Properties.DiskState = ptr(armcompute.DiskStateAttached)
		}
	}
	old := g.vms[key(name)]
	if old != nil {
		c.detachDropped(old.Properties.StorageProfile.DataDisks, p.StorageProfile.DataDisks)
	}
	// A new VM starts; an update (a PUT or PATCH of one that exists) keeps its power state,
	// as on Azure.
	power := "running"
	if old != nil {
		power = old.power
	}
	g.vms[key(name)] = &vm{VirtualMachine: *clone(&v), power: power}
	if old == nil {
		c.started(rg, name)
	}
	return *clone(&v), nil
}

// checkConfidential is what Azure refuses of a confidential VM's request.
func checkConfidential(v armcompute.VirtualMachine) *apiError {
	p := v.Properties
	if p == nil || p.HardwareProfile == nil || p.StorageProfile == nil || p.StorageProfile.OSDisk == nil || p.NetworkProfile == nil {
		return badRequest("InvalidParameter")
	}
	sp := p.SecurityProfile
	if sp == nil || sp.SecurityType == nil || *sp.SecurityType != armcompute.SecurityTypesConfidentialVM {
		return nil // not confidential: Azure creates it; the provider must never ask for one
	}
	if sp.UefiSettings == nil || sp.UefiSettings.VTpmEnabled == nil || !*sp.UefiSettings.VTpmEnabled {
		return badRequest("VTpmMustBeEnabledForConfidentialVM")
	}
	md := p.StorageProfile.OSDisk.ManagedDisk
	if md == nil || md.SecurityProfile == nil || md.SecurityProfile.SecurityEncryptionType == nil {
		return badRequest("SecurityEncryptionTypeRequiredForConfidentialVM")
	}
	size := strings.ToLower(string(*p.HardwareProfile.VMSize))
	if !strings.HasPrefix(size, "standard_dc") && !strings.HasPrefix(size, "standard_ec") {
		return badRequest("VMSizeNotSupportedForConfidentialVM")
	}
	return nil
}

// deleteVM deletes a VM with the resources its delete options name: its network interfaces
// and OS disk are deleted ("Delete"), its data disks detached. Called with c.mu held.
func (c *Cloud) deleteVM(rg, name string) *apiError {
	g, err := c.groupOf(rg)
	if err != nil {
		return err
	}
	v, ok := g.vms[key(name)]
	if !ok {
		return notFound("ResourceNotFound")
	}
	for _, nic := range v.Properties.NetworkProfile.NetworkInterfaces {
		_, _, nicName, _, _ := c.ref(*nic.ID)
		if n := g.nics[key(nicName)]; n != nil {
			n.Properties.VirtualMachine = nil
			if nic.Properties != nil && nic.Properties.DeleteOption != nil && *nic.Properties.DeleteOption == armcompute.DeleteOptionsDelete {
				delete(g.nics, key(nicName))
			}
		}
	}
	for _, d := range v.Properties.StorageProfile.DataDisks {
		if d.ManagedDisk == nil || d.ManagedDisk.ID == nil {
			continue
		}
		_, _, diskName, _, _ := c.ref(*d.ManagedDisk.ID)
		if disk := g.disks[key(diskName)]; disk != nil {
			disk.ManagedBy = nil
			disk.Properties.DiskState = ptr(armcompute.DiskStateUnattached)
			if d.DeleteOption != nil && *d.DeleteOption == armcompute.DiskDeleteOptionTypesDelete {
				delete(g.disks, key(diskName))
			}
		}
	}
	delete(g.vms, key(name))
	if v.power == "running" {
		c.stopped(rg, name)
	}
	return nil
}

// checkDataDisks is what Azure refuses of a VM's data disks: two at one LUN, a LUN out of
// 0-63, one disk twice. Called with c.mu held.
func (c *Cloud) checkDataDisks(disks []*armcompute.DataDisk) *apiError {
	luns, ids := map[int32]bool{}, map[string]bool{}
	for _, d := range disks {
		if d.Lun == nil || *d.Lun < 0 || *d.Lun > 63 || luns[*d.Lun] {
			return badRequest("InvalidParameter") // "A disk at LUN n already exists"
		}
		luns[*d.Lun] = true
		if d.ManagedDisk != nil && d.ManagedDisk.ID != nil {
			if ids[key(*d.ManagedDisk.ID)] {
				return badRequest("InvalidParameter")
			}
			ids[key(*d.ManagedDisk.ID)] = true
		}
	}
	return nil
}

// detachDropped frees the managed disks an update of a VM no longer lists. Called with c.mu
// held.
func (c *Cloud) detachDropped(before, after []*armcompute.DataDisk) {
	kept := map[string]bool{}
	for _, d := range after {
		if d.ManagedDisk != nil && d.ManagedDisk.ID != nil {
			kept[key(*d.ManagedDisk.ID)] = true
		}
	}
	for _, d := range before {
		if d.ManagedDisk == nil || d.ManagedDisk.ID == nil || kept[key(*d.ManagedDisk.ID)] {
			continue
		}
		if disk, err := c.lookup(*d.ManagedDisk.ID); err == nil {
			disk.(*armcompute.Disk).ManagedBy = nil
			disk.(*armcompute.Disk).Properties.DiskState = ptr(armcompute.DiskStateUnattached)
		}
	}
}
