package metaserver_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/csidriver"
	. "github.com/openconstellation/constellation/internal/provider/local/metaserver"
	"github.com/openconstellation/constellation/internal/provider/local/volumestore"
)

// Addresses of the test's nodes: each request leaves from its node's loopback address, so
// the server identifies it by its source address as in the cluster.
const (
	cpAddr      = "127.0.0.1"
	worker0Addr = "127.0.0.2"
	worker1Addr = "127.0.0.3"
	strayAddr   = "127.0.0.9" // no node has it
)

// volumeAPI serves the volume API as the provider does (metaserver.New, SetVolumes with the
// store the provider opens) and returns its URL and the store.
func volumeAPI(t *testing.T) (string, *volumestore.Store) {
	t.Helper()
	nodes := []Node{
		{Name: "control-plane-0", Role: "control-plane", IPs: []netip.Addr{netip.MustParseAddr(cpAddr)}},
		{Name: "worker-0", Role: "worker", IPs: []netip.Addr{netip.MustParseAddr(worker0Addr)}},
		{Name: "worker-1", Role: "worker", IPs: []netip.Addr{netip.MustParseAddr(worker1Addr)}},
	}
	srv := New(nodes, nil, []byte(testHash))
	store, err := volumestore.Open(filepath.Join(t.TempDir(), "volumes"))
	require.NoError(t, err)
	srv.SetVolumes(store)
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return ts.URL, store
}

// call makes a request from the address from and returns the status and the body.
func call(t *testing.T, base, from, method, path, body string) (int, string) {
	t.Helper()
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c := &http.Client{Transport: &http.Transport{DialContext: dialer.DialContext}, Timeout: 10 * time.Second}
	t.Cleanup(c.CloseIdleConnections)
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, base+path, r)
	require.NoError(t, err)
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

func reason(t *testing.T, body string) VolumeError {
	t.Helper()
	var e VolumeError
	require.NoError(t, json.Unmarshal([]byte(body), &e), body)
	return e
}

var (
	volID    = csidriver.IDFor("pvc-victim")
	otherVol = csidriver.IDFor("pvc-other")
)

// TestVolumeChangesControlPlaneOnly: a worker (or any address that is no node) cannot create,
// read, delete, attach, detach or expand a volume, not even to attach another node's volume
// to itself; the volumes stay as they were.
func TestVolumeChangesControlPlaneOnly(t *testing.T) {
	ctx := context.Background()
	for name, tc := range map[string]struct{ method, path, body string }{
		"create":                              {http.MethodPut, "/v1/volumes/" + otherVol, `{"bytes":1048576}`},
		"get":                                 {http.MethodGet, "/v1/volumes/" + volID, ""},
		"delete":                              {http.MethodDelete, "/v1/volumes/" + volID, ""},
		"attach to itself":                    {http.MethodPut, "/v1/volumes/" + volID + "/attachment", `{"node":"worker-0"}`},
		"detach from its node":                {http.MethodDelete, "/v1/volumes/" + volID + "/attachment/worker-1", ""},
		"expand":                              {http.MethodPost, "/v1/volumes/" + volID + "/expand", `{"bytes":2097152}`},
		"a bad id, refused as a caller first": {http.MethodGet, "/v1/volumes/..%2f..%2fetc", ""},
	} {
		for _, from := range []string{worker0Addr, strayAddr} {
			t.Run(name+" from "+from, func(t *testing.T) {
				base, store := volumeAPI(t)
				_, err := store.Create(ctx, volID, 1<<20)
				require.NoError(t, err)
				require.NoError(t, store.Attach(ctx, volID, "worker-1"))

				status, body := call(t, base, from, tc.method, tc.path, tc.body)
				assert.Equal(t, http.StatusForbidden, status, body)
				assert.Equal(t, ReasonForbidden, reason(t, body).Reason)

				v, err := store.Get(ctx, volID)
				require.NoError(t, err)
				assert.Equal(t, csidriver.Volume{ID: volID, Bytes: 1 << 20, AttachedTo: "worker-1"}, v, "unchanged")
				_, err = store.Get(ctx, otherVol)
				assert.ErrorIs(t, err, csidriver.ErrNotFound, "nothing created")
			})
		}
	}
}

// TestVolumeLookupOwnOnly: a node learns the backing file of a volume attached to itself, and
// of no other volume: not one attached to another node, not a detached one, not one that does
// not exist (told apart from none of the others).
func TestVolumeLookupOwnOnly(t *testing.T) {
	ctx := context.Background()
	base, store := volumeAPI(t)
	_, err := store.Create(ctx, volID, 1<<20)
	require.NoError(t, err)
	_, err = store.Create(ctx, otherVol, 1<<20)
	require.NoError(t, err)
	require.NoError(t, store.Attach(ctx, volID, "worker-1"))

	status, body := call(t, base, worker1Addr, http.MethodGet, "/v1/self/volumes/"+volID, "")
	require.Equal(t, http.StatusOK, status, body)
	var p VolumePath
	require.NoError(t, json.Unmarshal([]byte(body), &p))
	assert.Equal(t, filepath.Join(store.Dir(), volID+".img"), p.Path)

	for name, tc := range map[string]struct{ from, id, reason string }{
		"attached to another node":          {worker0Addr, volID, ReasonNotAttached},
		"attached to another node, by a cp": {cpAddr, volID, ReasonNotAttached},
		"detached":                          {worker1Addr, otherVol, ReasonNotAttached},
		"none of that id":                   {worker0Addr, csidriver.IDFor("pvc-none"), ReasonNotAttached},
		"from an address that is no node":   {strayAddr, volID, ReasonForbidden},
	} {
		t.Run(name, func(t *testing.T) {
			status, body := call(t, base, tc.from, http.MethodGet, "/v1/self/volumes/"+tc.id, "")
			assert.Equal(t, http.StatusForbidden, status, body)
			e := reason(t, body)
			assert.Equal(t, tc.reason, e.Reason)
			assert.NotContains(t, body, ".img", "no path in a refusal")
		})
	}
}

// TestVolumeRequestsChecked: a control plane's malformed requests are refused with a reason,
// and an attachment to a node the platform does not have is refused.
func TestVolumeRequestsChecked(t *testing.T) {
	ctx := context.Background()
	for name, tc := range map[string]struct {
		method, path, body string
		status             int
		reason             string
	}{
		"bad id":               {http.MethodPut, "/v1/volumes/vol-XYZ", `{"bytes":1}`, http.StatusBadRequest, ReasonBadRequest},
		"size 0":               {http.MethodPut, "/v1/volumes/" + otherVol, `{"bytes":0}`, http.StatusBadRequest, ReasonBadRequest},
		"no size":              {http.MethodPut, "/v1/volumes/" + otherVol, `{}`, http.StatusBadRequest, ReasonBadRequest},
		"size too large":       {http.MethodPut, "/v1/volumes/" + otherVol, `{"bytes":1099511627777}`, http.StatusBadRequest, ReasonBadRequest},
		"unknown field":        {http.MethodPut, "/v1/volumes/" + otherVol, `{"bytes":1,"mode":"rwx"}`, http.StatusBadRequest, ReasonBadRequest},
		"duplicate field":      {http.MethodPost, "/v1/volumes/" + volID + "/expand", `{"bytes":1,"bytes":9}`, http.StatusBadRequest, ReasonBadRequest},
		"case variant":         {http.MethodPut, "/v1/volumes/" + volID + "/attachment", `{"Node":"worker-0"}`, http.StatusBadRequest, ReasonBadRequest},
		"oversized body":       {http.MethodPut, "/v1/volumes/" + otherVol, `{"bytes":1` + strings.Repeat(" ", 2<<10) + `}`, http.StatusBadRequest, ReasonBadRequest},
		"bad node name":        {http.MethodPut, "/v1/volumes/" + volID + "/attachment", `{"node":"../worker"}`, http.StatusBadRequest, ReasonBadRequest},
		"attach to no node":    {http.MethodPut, "/v1/volumes/" + volID + "/attachment", `{"node":"worker-9"}`, http.StatusNotFound, ReasonNodeNotFound},
		"exists, another size": {http.MethodPut, "/v1/volumes/" + volID, `{"bytes":2}`, http.StatusConflict, ReasonExists},
		"get none":             {http.MethodGet, "/v1/volumes/" + otherVol, "", http.StatusNotFound, ReasonNotFound},
	} {
		t.Run(name, func(t *testing.T) {
			base, store := volumeAPI(t)
			_, err := store.Create(ctx, volID, 1<<20)
			require.NoError(t, err)
			status, body := call(t, base, cpAddr, tc.method, tc.path, tc.body)
			assert.Equal(t, tc.status, status, body)
			assert.Equal(t, tc.reason, reason(t, body).Reason, body)
			v, err := store.Get(ctx, volID)
			require.NoError(t, err)
			assert.Equal(t, csidriver.Volume{ID: volID, Bytes: 1 << 20}, v, "unchanged")
		})
	}

	t.Run("attached elsewhere names the node; delete of an attached volume refused", func(t *testing.T) {
		base, store := volumeAPI(t)
		_, err := store.Create(ctx, volID, 1<<20)
		require.NoError(t, err)
		require.NoError(t, store.Attach(ctx, volID, "worker-1"))
		status, body := call(t, base, cpAddr, http.MethodPut, "/v1/volumes/"+volID+"/attachment", `{"node":"worker-0"}`)
		assert.Equal(t, http.StatusConflict, status)
		assert.Equal(t, VolumeError{Reason: ReasonAttachedElsewhere, Node: "worker-1", Message: "volume " + volID + " is attached to node worker-1"}, reason(t, body))
		status, body = call(t, base, cpAddr, http.MethodDelete, "/v1/volumes/"+volID, "")
		assert.Equal(t, http.StatusConflict, status)
		assert.Equal(t, ReasonAttached, reason(t, body).Reason)
	})
}

func TestNoVolumeStorage(t *testing.T) {
	srv := New([]Node{{Name: "control-plane-0", Role: "control-plane", IPs: []netip.Addr{netip.MustParseAddr(cpAddr)}}}, nil, []byte(testHash))
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	status, body := call(t, ts.URL, cpAddr, http.MethodGet, "/v1/volumes/"+volID, "")
	assert.Equal(t, http.StatusNotImplemented, status)
	assert.Equal(t, ReasonNoVolumes, reason(t, body).Reason)
}
