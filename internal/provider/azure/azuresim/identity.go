package azuresim

import (
	"context"
	"net/http"
	"strings"

	azfake "github.com/Azure/azure-sdk-for-go/sdk/azcore/fake"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/authorization/armauthorization/v2"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/msi/armmsi"
	"github.com/google/uuid"
)

func (c *Cloud) serveIdentity() {
	tbl := func(g *group) map[string]*armmsi.Identity { return g.identities }
	ids := &c.msi.UserAssignedIdentitiesServer
	ids.Get = func(_ context.Context, rg, name string, _ *armmsi.UserAssignedIdentitiesClientGetOptions) (azfake.Responder[armmsi.UserAssignedIdentitiesClientGetResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		v, err := find(c, rg, name, tbl)
		return respond(armmsi.UserAssignedIdentitiesClientGetResponse{Identity: deref(v)}, err)
	}
	ids.CreateOrUpdate = func(_ context.Context, rg, name string, v armmsi.Identity, _ *armmsi.UserAssignedIdentitiesClientCreateOrUpdateOptions) (azfake.Responder[armmsi.UserAssignedIdentitiesClientCreateOrUpdateResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		v.ID, v.Name = ptr(c.id(rg, "Microsoft.ManagedIdentity/userAssignedIdentities", name)), ptr(name)
		if old, err := find(c, rg, name, tbl); err == nil {
			v.Properties = old.Properties
		} else {
			v.Properties = &armmsi.UserAssignedIdentityProperties{PrincipalID: ptr(uuid.NewString()), ClientID: ptr(uuid.NewString()), TenantID: ptr(uuid.Nil.String())}
		}
		stored, err := store(c, rg, name, &v, tbl)
		return respond(armmsi.UserAssignedIdentitiesClientCreateOrUpdateResponse{Identity: deref(stored)}, err)
	}
	ids.Delete = func(_ context.Context, rg, name string, _ *armmsi.UserAssignedIdentitiesClientDeleteOptions) (azfake.Responder[armmsi.UserAssignedIdentitiesClientDeleteResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		return respond(armmsi.UserAssignedIdentitiesClientDeleteResponse{}, drop(c, rg, name, tbl))
	}

	defs := &c.authz.RoleDefinitionsServer
	defs.CreateOrUpdate = func(_ context.Context, scope, name string, d armauthorization.RoleDefinition, _ *armauthorization.RoleDefinitionsClientCreateOrUpdateOptions) (azfake.Responder[armauthorization.RoleDefinitionsClientCreateOrUpdateResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		if _, err := uuid.Parse(name); err != nil {
			return respond(armauthorization.RoleDefinitionsClientCreateOrUpdateResponse{}, badRequest("InvalidRoleDefinitionId"))
		}
		c.roleDefs[scopeKey(scope, name)] = newRoleDef(d)
		d.ID, d.Name = ptr(scope+"/providers/Microsoft.Authorization/roleDefinitions/"+name), ptr(name)
		return respondWith(http.StatusCreated, armauthorization.RoleDefinitionsClientCreateOrUpdateResponse{RoleDefinition: d}, nil)
	}
	defs.Delete = func(_ context.Context, scope, name string, _ *armauthorization.RoleDefinitionsClientDeleteOptions) (azfake.Responder[armauthorization.RoleDefinitionsClientDeleteResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.roleDefs[scopeKey(scope, name)] == nil {
			// Azure answers 204 for a role that is gone.
			var resp azfake.Responder[armauthorization.RoleDefinitionsClientDeleteResponse]
			resp.SetResponse(http.StatusNoContent, armauthorization.RoleDefinitionsClientDeleteResponse{}, nil)
			return resp, azfake.ErrorResponder{}
		}
		delete(c.roleDefs, scopeKey(scope, name))
		return respond(armauthorization.RoleDefinitionsClientDeleteResponse{}, nil)
	}

	as := &c.authz.RoleAssignmentsServer
	as.Create = func(_ context.Context, scope, name string, a armauthorization.RoleAssignmentCreateParameters, _ *armauthorization.RoleAssignmentsClientCreateOptions) (azfake.Responder[armauthorization.RoleAssignmentsClientCreateResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.roleAssigns[scopeKey(scope, name)] != nil {
			return respond(armauthorization.RoleAssignmentsClientCreateResponse{}, conflict("RoleAssignmentExists"))
		}
		if a.Properties == nil || a.Properties.RoleDefinitionID == nil || c.roleDefs[roleDefKey(*a.Properties.RoleDefinitionID)] == nil {
			return respond(armauthorization.RoleAssignmentsClientCreateResponse{}, badRequest("RoleDefinitionDoesNotExist"))
		}
		c.roleAssigns[scopeKey(scope, name)] = &roleAssignment{
			scope: "/" + strings.ToLower(strings.Trim(scope, "/")), def: roleDefKey(*a.Properties.RoleDefinitionID), principal: deref(a.Properties.PrincipalID),
		}
		return respondWith(http.StatusCreated, armauthorization.RoleAssignmentsClientCreateResponse{RoleAssignment: armauthorization.RoleAssignment{Name: ptr(name)}}, nil)
	}
	as.Delete = func(_ context.Context, scope, name string, _ *armauthorization.RoleAssignmentsClientDeleteOptions) (azfake.Responder[armauthorization.RoleAssignmentsClientDeleteResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.roleAssigns[scopeKey(scope, name)] == nil {
			var resp azfake.Responder[armauthorization.RoleAssignmentsClientDeleteResponse]
			resp.SetResponse(http.StatusNoContent, armauthorization.RoleAssignmentsClientDeleteResponse{}, nil)
			return resp, azfake.ErrorResponder{}
		}
		delete(c.roleAssigns, scopeKey(scope, name))
		return respond(armauthorization.RoleAssignmentsClientDeleteResponse{}, nil)
	}
}

// roleDefKey turns a role definition ID (scope/providers/Microsoft.Authorization/
// roleDefinitions/name) into the key CreateOrUpdate stored it by (scope/name).
func roleDefKey(id string) string {
	const mid = "/providers/microsoft.authorization/roledefinitions/"
	if i := strings.Index(strings.ToLower(id), mid); i >= 0 {
		return scopeKey(id[:i], id[i+len(mid):])
	}
	return id
}

// scopeKey is the key of a role definition or assignment: the fakes pass the scope
// without its leading slash.
func scopeKey(scope, name string) string {
	return strings.ToLower(strings.Trim(scope, "/") + "/" + name)
}

// RoleAssignments returns how many role assignments exist.
func (c *Cloud) RoleAssignments() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.roleAssigns)
}
