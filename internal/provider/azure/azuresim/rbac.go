package azuresim

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/authorization/armauthorization/v2"
)

// Azure RBAC, as far as managed identities go: a token a VM's IMDS issued for an identity
// may do what the roles assigned to the identity's principal allow, at their scopes, and
// nothing else. Credential's token is the user's, who owns the subscription; any other token
// is refused as Azure refuses an invalid one.

// userToken is the token of Credential (the SDK's fake credential).
const userToken = "fake_token"

// identityTokenLife is how long a token IMDS issues lives: a minute, where Azure's live a
// day. The SDK keeps managed identities' tokens in one cache per process (MSAL's), by
// identity; a short life makes it ask IMDS again, so that no token outlives the simulated
// cloud that issued it, and a test's next cloud is asked for its own.
const identityTokenLife = time.Minute

// roleDef is a role definition's permissions.
type roleDef struct {
	actions, notActions []string
}

// roleAssignment gives a principal a role at a scope.
type roleAssignment struct {
	scope, def, principal string
}

func newRoleDef(d armauthorization.RoleDefinition) *roleDef {
	out := &roleDef{}
	if d.Properties == nil {
		return out
	}
	for _, p := range d.Properties.Permissions {
		for _, a := range p.Actions {
			out.actions = append(out.actions, deref(a))
		}
		for _, a := range p.NotActions {
			out.notActions = append(out.notActions, deref(a))
		}
	}
	return out
}

// authorize checks the request of a token IMDS issued against the roles of its identity. It
// returns the refusal Azure answers, or nil. Called with c.mu held.
func (c *Cloud) authorize(req *http.Request) *http.Response {
	token, _ := strings.CutPrefix(req.Header.Get("Authorization"), "Bearer ")
	if token == userToken || isPoll(req) {
		return nil
	}
	principal, ok := c.tokens[token]
	if !ok {
		return errorResponse(req, http.StatusUnauthorized, "InvalidAuthenticationToken", "The access token is invalid.", 0)
	}
	action := operation(req.Method, req.URL.Path)
	scope := strings.ToLower(strings.TrimSuffix(req.URL.Path, "/"))
	for _, a := range c.roleAssigns {
		def := c.roleDefs[a.def]
		if a.principal != principal || def == nil {
			continue
		}
		if scope != a.scope && !strings.HasPrefix(scope, a.scope+"/") {
			continue
		}
		if def.allows(action) {
			return nil
		}
	}
	return errorResponse(req, http.StatusForbidden, "AuthorizationFailed", fmt.Sprintf(
		"The client with object id '%s' does not have authorization to perform action '%s' over scope '%s' or the scope is invalid.",
		principal, action, req.URL.Path), 0)
}

func (d *roleDef) allows(action string) bool {
	match := func(patterns []string) bool {
		for _, p := range patterns {
			if strings.EqualFold(p, action) || p == "*" ||
				(strings.HasSuffix(p, "/*") && strings.HasPrefix(strings.ToLower(action), strings.ToLower(strings.TrimSuffix(p, "*")))) {
				return true
			}
		}
		return false
	}
	return match(d.actions) && !match(d.notActions)
}

// operation is the RBAC action of a Resource Manager request: the resource type of its path
// and read, write, delete or (a POST) the action its last segment names.
// /subscriptions/S/resourceGroups/G/providers/Microsoft.Compute/virtualMachines/vm/start with
// POST is Microsoft.Compute/virtualMachines/start/action.
func operation(method, path string) string {
	segs := strings.Split(strings.Trim(path, "/"), "/")
	typ := "Microsoft.Resources/subscriptions/resourceGroups"
	var rest []string
	for i, s := range segs {
		if strings.EqualFold(s, "providers") && i+1 < len(segs) {
			typ, rest = segs[i+1], segs[i+2:]
		}
	}
	var action string
	for i, s := range rest {
		if i%2 == 0 {
			if method == http.MethodPost && i == len(rest)-1 && i > 0 {
				action = s // .../virtualMachines/vm/start
				break
			}
			typ += "/" + s
		}
	}
	switch {
	case action != "":
		return typ + "/" + action + "/action"
	case method == http.MethodGet || method == http.MethodHead:
		return typ + "/read"
	case method == http.MethodDelete:
		return typ + "/delete"
	case method == http.MethodPost:
		return typ + "/action"
	}
	return typ + "/write"
}
