// Package azuresim is a stateful, in-memory Azure Resource Manager for tests: the fake
// servers of the Azure SDK for Go (armcompute/fake, armnetwork/fake, ...) answered from
// one shared state, so that the provider's real clients (their serialization, pollers, pagers
// and retries) run a cluster's whole life against it: a resource created is there when read,
// gone when deleted, and a resource group's deletion takes its resources with it.
//
// It checks what Azure checks that the provider relies on (references between resources,
// a disk or network interface used by one VM only, confidential VMs with a vTPM) and answers
// with Azure's error codes. Faults are injected per API (Inject): throttling with
// Retry-After, failures before or halfway through a long-running operation.
//
// What it does not model is listed in docs/azure.md "Tests": it is a test double of the
// resource API the provider calls, not of Azure.
package azuresim

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	azfake "github.com/Azure/azure-sdk-for-go/sdk/azcore/fake"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/fake/server"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
	authzfake "github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/authorization/armauthorization/v2/fake"
	computefake "github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v8/fake"
	msifake "github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/msi/armmsi/fake"
	networkfake "github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v7/fake"
	resourcesfake "github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/resources/armresources/v3/fake"
)

// Credential is a token credential the simulated cloud accepts.
var Credential = &azfake.TokenCredential{}

// Cloud is one simulated subscription.
type Cloud struct {
	Subscription string

	mu     sync.Mutex
	groups map[string]*group
	// roleDefs and roleAssigns are role definitions and assignments by scope/name (lower
	// case); tokens the principal of each token IMDS issued (rbac.go).
	roleDefs           map[string]*roleDef
	roleAssigns        map[string]*roleAssignment
	tokens             map[string]string
	faults             []*Fault
	calls              []string
	nextIP, nextPublic int
	hooks              Hooks
	// blobURL is the upload endpoint (ServeBlobs); blobs the page blobs of disks being
	// uploaded, by disk ID; versionBytes an image version's disk, by version ID.
	blobURL      string
	blobs        map[string]*pageBlob
	versionBytes map[string][]byte
	// pending are hook calls to make once the lock is released.
	pending []func()
	// internet, if served, makes public addresses real on this host (ServeInternet).
	internet *internet
	// imageCase, if set, is how VMs answer their image reference (AnswerImageReferences).
	imageCase func(string) string

	compute   computefake.ServerFactory
	network   networkfake.ServerFactory
	resources resourcesfake.ServerFactory
	msi       msifake.ServerFactory
	authz     authzfake.ServerFactory
	// transports are the fakes' transports by module and resource path (transportFor).
	transports map[string]policy.Transporter
}

// Hooks are called, outside the cloud's lock, when a VM starts or stops running (tests boot
// and stop a node for it), and when a VM's serial log is read (Console: what the VM wrote to
// its serial console). Any may be nil.
type Hooks struct {
	Started func(group, vm string)
	Stopped func(group, vm string)
	Console func(group, vm string) []byte
}

// New returns an empty subscription.
func New(subscription string, hooks Hooks) *Cloud {
	c := &Cloud{
		Subscription: subscription, groups: map[string]*group{},
		roleDefs: map[string]*roleDef{}, roleAssigns: map[string]*roleAssignment{}, tokens: map[string]string{}, hooks: hooks,
		blobs: map[string]*pageBlob{}, versionBytes: map[string][]byte{},
	}
	c.serveResources()
	c.serveCompute()
	c.serveNetwork()
	c.serveIdentity()
	c.serveGalleries()
	c.serveDiskAccess()
	c.serveBootDiagnostics()
	c.transports = map[string]policy.Transporter{}
	return c
}

// Fault is a failure the cloud answers a call of API with ("VirtualMachinesClient.
// BeginCreateOrUpdate"), Times times (0: once).
type Fault struct {
	API    string
	Status int
	Code   string
	// RetryAfter is sent as the Retry-After header.
	RetryAfter time.Duration
	// Halfway fails the long-running operation after it was accepted and polled once,
	// instead of refusing the request.
	Halfway bool
	// Polls, instead of a failure, makes the long-running operation answer "still running"
	// to that many more polls: a slow operation.
	Polls int
	Times int
}

// Inject adds a fault.
func (c *Cloud) Inject(f Fault) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f.Times == 0 {
		f.Times = 1
	}
	c.faults = append(c.faults, &f)
}

// takeFault returns and consumes a fault of api (halfway or not).
func (c *Cloud) takeFault(api string, halfway bool) *Fault {
	for _, f := range c.faults {
		if f.API == api && f.Halfway == halfway && f.Polls == 0 && f.Times > 0 {
			f.Times--
			return f
		}
	}
	return nil
}

// takeSlow returns and consumes how many more polls an operation of api answers "still
// running" to.
func (c *Cloud) takeSlow(api string) int {
	for _, f := range c.faults {
		if f.API == api && f.Polls > 0 && f.Times > 0 {
			f.Times--
			return f.Polls
		}
	}
	return 0
}

// AnswerImageReferences makes VMs created from now on answer their image reference as f
// gives it: Azure compares resource IDs without regard to case and may answer one in another
// case than it was given.
func (c *Cloud) AnswerImageReferences(f func(string) string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.imageCase = f
}

// Calls returns the APIs called so far, in order; a poll of a long-running operation is
// its API and " (poll)".
func (c *Cloud) Calls() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.calls...)
}

// Count returns how many times api was called.
func (c *Cloud) Count(api string) int {
	n := 0
	for _, call := range c.Calls() {
		if call == api {
			n++
		}
	}
	return n
}

// Transport routes the SDK's requests to the fake servers of their module.
func (c *Cloud) Transport() policy.Transporter { return transport{c} }

type transport struct{ c *Cloud }

func (t transport) Do(req *http.Request) (*http.Response, error) {
	defer t.c.syncInternet()
	defer t.c.runHooks()
	api, _ := req.Context().Value(runtime.CtxAPINameKey{}).(string)
	client, _, _ := strings.Cut(api, ".")
	poll := isPoll(req)
	t.c.mu.Lock()
	if poll {
		t.c.calls = append(t.c.calls, api+" (poll)")
	} else {
		t.c.calls = append(t.c.calls, api)
	}
	refused := t.c.authorize(req)
	var f *Fault
	if !poll && refused == nil {
		f = t.c.takeFault(api, false)
	}
	t.c.mu.Unlock()
	if refused != nil {
		return refused, nil
	}
	if f != nil {
		return errorResponse(req, f.Status, f.Code, "injected fault", f.RetryAfter), nil
	}
	tr, key := t.c.transportFor(client, req)
	if tr == nil {
		return errorResponse(req, http.StatusNotImplemented, "NotSimulated", "the simulated cloud does not serve "+api, 0), nil
	}
	resp, err := tr.Do(req)
	if err != nil || resp.StatusCode >= http.StatusBadRequest {
		t.c.forget(key)
	}
	return resp, err
}

// transportFor returns the fakes' transport of client's module for the resource req is
// about. The fakes track a long-running operation (and a pager) by its path until it
// succeeds; one that failed stays tracked, and the next operation on the path would get its
// empty responder. So each path has its own transport, renewed after a failure (forget).
func (c *Cloud) transportFor(client string, req *http.Request) (policy.Transporter, string) {
	var module string
	var mk func() policy.Transporter
	switch client {
	case "ResourceGroupsClient", "Client":
		module, mk = "resources", func() policy.Transporter { return resourcesfake.NewServerFactoryTransport(&c.resources) }
	case "VirtualMachinesClient", "DisksClient", "GalleriesClient", "GalleryImagesClient", "GalleryImageVersionsClient":
		module, mk = "compute", func() policy.Transporter { return computefake.NewServerFactoryTransport(&c.compute) }
	case "VirtualNetworksClient", "SecurityGroupsClient", "PublicIPAddressesClient", "LoadBalancersClient", "InterfacesClient", "RouteTablesClient":
		module, mk = "network", func() policy.Transporter { return networkfake.NewServerFactoryTransport(&c.network) }
	case "UserAssignedIdentitiesClient":
		module, mk = "msi", func() policy.Transporter { return msifake.NewServerFactoryTransport(&c.msi) }
	case "RoleDefinitionsClient", "RoleAssignmentsClient":
		module, mk = "authz", func() policy.Transporter { return authzfake.NewServerFactoryTransport(&c.authz) }
	default:
		return nil, ""
	}
	key := module + " " + strings.ToLower(server.SanitizePagerPollerPath(req.URL.Path))
	c.mu.Lock()
	defer c.mu.Unlock()
	tr, ok := c.transports[key]
	if !ok {
		tr = mk()
		c.transports[key] = tr
	}
	return tr, key
}

func (c *Cloud) forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.transports, key)
}

// started and stopped queue the hooks of a VM. Called with c.mu held.
func (c *Cloud) started(groupName, vm string) {
	if c.hooks.Started != nil {
		c.pending = append(c.pending, func() { c.hooks.Started(groupName, vm) })
	}
}

func (c *Cloud) stopped(groupName, vm string) {
	if c.hooks.Stopped != nil {
		c.pending = append(c.pending, func() { c.hooks.Stopped(groupName, vm) })
	}
}

func (c *Cloud) runHooks() {
	c.mu.Lock()
	pending := c.pending
	c.pending = nil
	c.mu.Unlock()
	for _, f := range pending {
		f()
	}
}

// isPoll says whether req polls a long-running operation of the fakes.
func isPoll(req *http.Request) bool { return strings.HasSuffix(req.URL.Path, "/get/fake/status") }

// errorResponse is Azure's error answer.
func errorResponse(req *http.Request, status int, code, msg string, retryAfter time.Duration) *http.Response {
	body := fmt.Sprintf(`{"error":{"code":%q,"message":%q}}`, code, msg)
	h := http.Header{"Content-Type": {"application/json"}, "X-Ms-Error-Code": {code}}
	if retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(int(retryAfter.Round(time.Second)/time.Second)))
	}
	return &http.Response{
		StatusCode: status, Status: fmt.Sprintf("%d %s", status, http.StatusText(status)),
		Header: h, Body: io.NopCloser(bytes.NewBufferString(body)), Request: req,
		ContentLength: int64(len(body)),
	}
}
