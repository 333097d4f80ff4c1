package azuresim

import (
	"encoding/json"
	"strings"
)

// find returns the resource name of group rg from the table tbl picks. Called with c.mu held.
func find[T any](c *Cloud, rg, name string, tbl func(*group) map[string]*T) (*T, *apiError) {
	g, err := c.groupOf(rg)
	if err != nil {
		return nil, err
	}
	v, ok := tbl(g)[key(name)]
	if !ok {
		return nil, notFound("ResourceNotFound")
	}
	return clone(v), nil
}

// store puts v as resource name (a PUT: created or replaced). Called with c.mu held.
func store[T any](c *Cloud, rg, name string, v *T, tbl func(*group) map[string]*T) (*T, *apiError) {
	g, err := c.groupOf(rg)
	if err != nil {
		return nil, err
	}
	tbl(g)[key(name)] = clone(v)
	return clone(v), nil
}

// drop deletes resource name; a missing one is Azure's 404 (the SDK's delete then says
// so, and the provider counts it as deleted). Called with c.mu held.
func drop[T any](c *Cloud, rg, name string, tbl func(*group) map[string]*T) *apiError {
	g, err := c.groupOf(rg)
	if err != nil {
		return err
	}
	if _, ok := tbl(g)[key(name)]; !ok {
		return notFound("ResourceNotFound")
	}
	delete(tbl(g), key(name))
	return nil
}

// clone copies a resource through JSON, as it travels: no caller shares the cloud's state.
func clone[T any](v *T) *T {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // the SDK's models always marshal
	}
	out := new(T)
	if err := json.Unmarshal(b, out); err != nil {
		panic(err)
	}
	return out
}

func deref[T any](v *T) T {
	if v == nil {
		var zero T
		return zero
	}
	return *v
}

// lookup finds the resource id names; for messages and reference checks. Called with c.mu
// held.
func (c *Cloud) lookup(id string) (any, *apiError) {
	rg, typ, name, _, ok := c.ref(id)
	if !ok {
		return nil, badRequest("LinkedInvalidPropertyId")
	}
	g, err := c.groupOf(rg)
	if err != nil {
		return nil, err
	}
	var v any
	var found bool
	switch strings.ToLower(typ) {
	case "microsoft.network/virtualnetworks":
		v, found = g.vnets[key(name)]
	case "microsoft.network/networksecuritygroups":
		v, found = g.nsgs[key(name)]
	case "microsoft.network/publicipaddresses":
		v, found = g.publicIPs[key(name)]
	case "microsoft.network/loadbalancers":
		v, found = g.lbs[key(name)]
	case "microsoft.network/networkinterfaces":
		v, found = g.nics[key(name)]
	case "microsoft.compute/disks":
		v, found = g.disks[key(name)]
	case "microsoft.compute/virtualmachines":
		v, found = g.vms[key(name)]
	case "microsoft.network/routetables":
		v, found = g.routeTables[key(name)]
	case "microsoft.managedidentity/userassignedidentities":
		v, found = g.identities[key(name)]
	}
	if !found {
		return nil, notFound("NotFound")
	}
	return v, nil
}

// childExists says whether the part id names (a subnet, a load balancer's pool or rule)
// exists: its resource exists and mentions the part's ID. Called with c.mu held.
func (c *Cloud) childExists(id string) bool {
	v, err := c.lookup(id)
	if err != nil {
		return false
	}
	b, _ := json.Marshal(v)
	return strings.Contains(strings.ToLower(string(b)), `"id":"`+strings.ToLower(id)+`"`)
}

// inUse refuses to delete the resource id while another resource of its group refers to it
// (Azure's "in use" conflicts). Called with c.mu held.
func (c *Cloud) inUse(rg, id string) *apiError {
	g, err := c.groupOf(rg)
	if err != nil {
		return nil // the delete answers the 404
	}
	needle := strings.ToLower(id)
	for _, r := range g.resources(c.groupID(rg)) {
		if strings.EqualFold(*r.ID, id) {
			continue
		}
		v, err := c.lookup(*r.ID)
		if err != nil {
			continue
		}
		b, _ := json.Marshal(v)
		text := strings.ToLower(string(b))
		// its own parts mention its ID as a prefix too: only other resources count.
		if strings.Contains(text, `"`+needle+`"`) || strings.Contains(text, `"`+needle+`/`) {
			return conflict("InUseResourceCannotBeDeleted")
		}
	}
	return nil
}
