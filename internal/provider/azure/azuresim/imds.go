package azuresim

import (
	"encoding/json"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v8"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/msi/armmsi"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v7"
	"github.com/google/uuid"
)

// IMDS is the Instance Metadata Service as VM name of group rg reaches it: what the cloud
// holds of the VM now (its tags, data disks and addresses), in the shape of IMDS's answer to
// GET /metadata/instance (api-version 2021-02-01), and tokens of the VM's managed identities
// (GET /metadata/identity/oauth2/token), which the simulated Resource Manager authorizes by
// the identities' roles (rbac.go). As Azure's, it refuses a request without
// the "Metadata: true" header or with an X-Forwarded-For header (it answers no proxy), and
// one without an api-version. It is how a test runs the node half (azuremeta, azurenode) on
// the VM the host half made.
func (c *Cloud) IMDS(rg, name string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Header.Get("Metadata") != "true" || r.Header.Get("X-Forwarded-For") != "":
			imdsError(w, http.StatusBadRequest, "Bad request. Required metadata header not specified")
			return
		case r.URL.Query().Get("api-version") == "":
			imdsError(w, http.StatusBadRequest, "Bad request. api-version was not specified in the request.")
			return
		case r.Method == http.MethodGet && r.URL.Path == "/metadata/identity/oauth2/token":
			c.serveToken(w, r, rg, name)
			return
		case r.Method != http.MethodGet || r.URL.Path != "/metadata/instance":
			imdsError(w, http.StatusNotFound, "Not found")
			return
		}
		answer, ok := c.imdsInstance(rg, name)
		if !ok {
			// Only a VM reaches IMDS: there is no VM to answer for.
			imdsError(w, http.StatusNotFound, "Not found")
			return
		}
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		_ = json.NewEncoder(w).Encode(answer)
	})
}

func imdsError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

// imdsInstance is IMDS's answer about the VM, from the cloud's state.
func (c *Cloud) imdsInstance(rg, name string) (map[string]any, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, err := find(c, rg, name, func(g *group) map[string]*vm { return g.vms })
	if err != nil {
		return nil, false
	}
	p := v.Properties
	tagsList := []map[string]string{}
	var tags []string
	for _, k := range slices.Sorted(maps.Keys(v.Tags)) {
		tagsList = append(tagsList, map[string]string{"name": k, "value": deref(v.Tags[k])})
		tags = append(tags, k+":"+deref(v.Tags[k]))
	}
	dataDisks := []map[string]any{}
	for _, d := range p.StorageProfile.DataDisks {
		disk := map[string]any{"lun": strconv.Itoa(int(deref(d.Lun))), "name": deref(d.Name), "createOption": string(deref(d.CreateOption)), "caching": string(deref(d.Caching))}
		if d.ManagedDisk != nil {
			disk["managedDisk"] = map[string]string{"id": deref(d.ManagedDisk.ID), "storageAccountType": string(deref(d.ManagedDisk.StorageAccountType))}
		}
		dataDisks = append(dataDisks, disk)
	}
	compute := map[string]any{
		"azEnvironment": "AzurePublicCloud", "name": name, "location": deref(v.Location), "resourceGroupName": rg,
		"resourceId": deref(v.ID), "subscriptionId": c.Subscription, "osType": "Linux",
		"tags": strings.Join(tags, ";"), "tagsList": tagsList, "vmSize": string(deref(p.HardwareProfile.VMSize)),
		"storageProfile": map[string]any{"dataDisks": dataDisks},
	}
	if p.VMID != nil {
		compute["vmId"] = *p.VMID
	}
	return map[string]any{"compute": compute, "network": map[string]any{"interface": c.imdsInterfaces(p.NetworkProfile.NetworkInterfaces)}}, true
}

// imdsInterfaces are the VM's network interfaces as IMDS lists them: the primary first.
// Called with c.mu held.
func (c *Cloud) imdsInterfaces(refs []*armcompute.NetworkInterfaceReference) []map[string]any {
	out := []map[string]any{}
	for _, ref := range refs {
		found, err := c.lookup(deref(ref.ID))
		if err != nil {
			continue
		}
		nic := found.(*armnetwork.Interface)
		addrs := []map[string]string{}
		for _, ipc := range nic.Properties.IPConfigurations {
			if ipc.Properties != nil && ipc.Properties.PrivateIPAddress != nil {
				addrs = append(addrs, map[string]string{"privateIpAddress": *ipc.Properties.PrivateIPAddress, "publicIpAddress": ""})
			}
		}
		entry := map[string]any{"ipv4": map[string]any{"ipAddress": addrs}, "ipv6": map[string]any{"ipAddress": []any{}}}
		if ref.Properties != nil && ref.Properties.Primary != nil && *ref.Properties.Primary {
			out = append([]map[string]any{entry}, out...)
		} else {
			out = append(out, entry)
		}
	}
	return out
}

// serveToken issues a token of one of the VM's user-assigned identities: the one msi_res_id
// (or client_id) names, or the only one. As Azure's IMDS, it refuses an identity the VM does
// not carry and, when the VM carries several, a request that names none.
func (c *Cloud) serveToken(w http.ResponseWriter, r *http.Request, rg, name string) {
	q := r.URL.Query()
	if q.Get("resource") == "" {
		imdsTokenError(w, "invalid_request", "Required query variable 'resource' is missing")
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	v, err := find(c, rg, name, func(g *group) map[string]*vm { return g.vms })
	if err != nil {
		imdsError(w, http.StatusNotFound, "Not found")
		return
	}
	var carried []*armmsi.Identity
	if v.Identity != nil {
		for id := range v.Identity.UserAssignedIdentities {
			if found, err := c.lookup(id); err == nil {
				carried = append(carried, found.(*armmsi.Identity))
			}
		}
	}
	resID, clientID := q.Get("msi_res_id"), q.Get("client_id")
	if resID == "" {
		resID = q.Get("mi_res_id")
	}
	var chosen *armmsi.Identity
	for _, ident := range carried {
		switch {
		case resID != "" && strings.EqualFold(deref(ident.ID), resID),
			clientID != "" && strings.EqualFold(deref(ident.Properties.ClientID), clientID),
			resID == "" && clientID == "" && len(carried) == 1:
			chosen = ident
		}
	}
	if chosen == nil {
		msg := "Identity not found"
		if resID == "" && clientID == "" && len(carried) > 1 {
			msg = "Multiple user assigned identities exist, please specify the clientId / resourceId of the identity in the token request"
		}
		imdsTokenError(w, "invalid_request", msg)
		return
	}
	token := "azuresim-identity-" + uuid.NewString()
	life := strconv.Itoa(int(identityTokenLife / time.Second))
	c.tokens[token] = deref(chosen.Properties.PrincipalID)
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	_ = json.NewEncoder(w).Encode(map[string]string{
		"access_token": token, "client_id": deref(chosen.Properties.ClientID), "msi_res_id": deref(chosen.ID),
		"expires_in": life, "expires_on": strconv.FormatInt(time.Now().Add(identityTokenLife).Unix(), 10),
		"ext_expires_in": life, "not_before": strconv.FormatInt(time.Now().Unix(), 10),
		"resource": q.Get("resource"), "token_type": "Bearer",
	})
}

func imdsTokenError(w http.ResponseWriter, code, msg string) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(http.StatusBadRequest)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": code, "error_description": msg})
}

// ServeIMDS serves VM name's IMDS (IMDS) on a test server until t ends, and returns its URL.
func (c *Cloud) ServeIMDS(t testing.TB, rg, name string) string {
	srv := httptest.NewServer(c.IMDS(rg, name))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TransportFrom is the cloud as VM name of group rg reaches it: its IMDS at Azure's
// link-local address (the SDK's managed identity credential asks it for tokens), Resource
// Manager as Transport serves it.
func (c *Cloud) TransportFrom(rg, name string) policy.Transporter {
	return vmTransport{cloud: transport{c}, imds: c.IMDS(rg, name)}
}

type vmTransport struct {
	cloud transport
	imds  http.Handler
}

func (t vmTransport) Do(req *http.Request) (*http.Response, error) {
	if req.URL.Host != "169.254.169.254" {
		return t.cloud.Do(req)
	}
	rec := httptest.NewRecorder()
	t.imds.ServeHTTP(rec, req)
	resp := rec.Result()
	resp.Request = req
	return resp, nil
}
