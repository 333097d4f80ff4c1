package azuremeta

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/metadata"
)

func TestIMDSInstance(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("testdata", "instance.json"))
	require.NoError(t, err)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// What IMDS requires of a request: the header, and no proxy in between.
		if r.Header.Get("Metadata") != "true" || r.URL.Path != "/metadata/instance" || r.URL.Query().Get("api-version") != imdsAPIVersion {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		_, _ = w.Write(doc)
	}))
	t.Cleanup(srv.Close)

	inst, err := IMDS{BaseURL: srv.URL}.Instance(t.Context())
	require.NoError(t, err)
	assert.Equal(t, "0123abcd", inst.UID())
	assert.Equal(t, "mini-rg", inst.ResourceGroup)
	assert.Equal(t, []byte("$2a$10$abc"), inst.InitSecretHash())
	self, err := inst.Self()
	require.NoError(t, err)
	assert.Equal(t, metadata.Instance{Name: "control-plane-0", Role: metadata.ControlPlane, IPs: []netip.Addr{netip.MustParseAddr("10.9.0.4")}}, self)
	assert.Equal(t, []DataDisk{{Name: "control-plane-0-state", LUN: 0}, {Name: "vol-0123456789abcdef0123456789abcdef", LUN: 1}}, inst.DataDisks)

	_, err = IMDS{BaseURL: srv.URL + "/nowhere"}.Instance(t.Context())
	assert.ErrorContains(t, err, "IMDS answered 400 Bad Request")
}

func TestParseInstanceRefuses(t *testing.T) {
	testCases := map[string]struct {
		body    string
		wantErr string
	}{
		"not JSON":            {body: "<html>", wantErr: "IMDS's answer"},
		"no name":             {body: `{"compute":{}}`, wantErr: "names no VM"},
		"a bad address":       {body: `{"compute":{"name":"a"},"network":{"interface":[{"ipv4":{"ipAddress":[{"privateIpAddress":"10.9.0.300"}]}}]}}`, wantErr: `private address "10.9.0.300"`},
		"a LUN not a number":  {body: `{"compute":{"name":"a","storageProfile":{"dataDisks":[{"lun":"x","name":"d"}]}}}`, wantErr: `data disk "d" at LUN "x"`},
		"a LUN missing":       {body: `{"compute":{"name":"a","storageProfile":{"dataDisks":[{"name":"d"}]}}}`, wantErr: `data disk "d" at LUN`},
		"a LUN too large":     {body: `{"compute":{"name":"a","storageProfile":{"dataDisks":[{"lun":"64","name":"d"}]}}}`, wantErr: "want a name and a LUN in 0-63"},
		"a disk without name": {body: `{"compute":{"name":"a","storageProfile":{"dataDisks":[{"lun":"1"}]}}}`, wantErr: `data disk "" at LUN "1"`},
		"a negative LUN":      {body: `{"compute":{"name":"a","storageProfile":{"dataDisks":[{"lun":-1,"name":"d"}]}}}`, wantErr: `data disk "d" at LUN -1`},
		"too large":           {body: `{"compute":{"name":"` + strings.Repeat("a", maxIMDSAnswer) + `"}}`, wantErr: "more than"},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			_, err := ParseInstance([]byte(tc.body))
			assert.ErrorContains(t, err, tc.wantErr)
		})
	}
	// A VM of no cluster: IMDS parses, the node refuses to be it.
	inst, err := ParseInstance([]byte(`{"compute":{"name":"someone-else"},"network":{"interface":[{"ipv4":{"ipAddress":[{"privateIpAddress":"10.0.0.4"}]}}]}}`))
	require.NoError(t, err)
	_, err = inst.Self()
	assert.ErrorContains(t, err, `IMDS describes VM someone-else as no node of a cluster: instance metadata "someone-else": role "", want control-plane or worker`)
}

func FuzzParseInstance(f *testing.F) {
	doc, err := os.ReadFile(filepath.Join("testdata", "instance.json"))
	require.NoError(f, err)
	f.Add(doc)
	f.Add([]byte(`{"compute":{"name":"a","tagsList":[{"name":"constellation-role","value":"worker"}]}}`))
	f.Add([]byte(`{"compute":{"name":"a","storageProfile":{"dataDisks":[{"lun":2,"name":"d"},{"lun":"3","name":"e"}]}}}`))
	f.Add([]byte(`{"network":{"interface":[{"ipv4":{"ipAddress":[{"privateIpAddress":"::1"}]}}]}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		inst, err := ParseInstance(body)
		if err != nil {
			return
		}
		// What parsed is usable: a name, valid addresses; Self never panics.
		if inst.Name == "" {
			t.Fatal("parsed an instance without a name")
		}
		for _, d := range inst.DataDisks {
			if d.Name == "" || d.LUN < 0 || d.LUN > MaxLUN {
				t.Fatalf("parsed a data disk %+v from %q", d, body)
			}
		}
		for _, ip := range inst.IPs {
			if !ip.IsValid() {
				t.Fatalf("parsed an invalid address from %q", body)
			}
		}
		_, _ = inst.Self()
	})
}

func TestManagedIdentity(t *testing.T) {
	inst := Instance{Name: "control-plane-0", Subscription: "00000000-0000-0000-0000-000000000001", ResourceGroup: "mini-rg", Tags: map[string]string{
		TagNodesIdentity: "mini-nodes", TagVolumesIdentity: "mini-volumes",
	}}
	for _, tag := range []string{TagNodesIdentity, TagVolumesIdentity} {
		cred, err := ManagedIdentity(inst, tag, nil)
		require.NoError(t, err, tag)
		assert.NotNil(t, cred)
	}

	worker := Instance{Name: "worker-0", Subscription: inst.Subscription, ResourceGroup: "mini-rg", Tags: map[string]string{TagNodesIdentity: "mini-nodes"}}
	_, err := ManagedIdentity(worker, TagVolumesIdentity, nil)
	assert.EqualError(t, err, `VM worker-0: tag constellation-volumes-identity="" names no managed identity of its group`)
	_, err = ManagedIdentity(Instance{Name: "old", Tags: map[string]string{}}, TagNodesIdentity, nil)
	assert.NoError(t, err, "a VM with the nodes' identity only")

	for _, bad := range []string{"../../other/providers/x", "a", "mini nodes", "mini-nodes?api-version=1"} {
		inst.Tags[TagNodesIdentity] = bad
		_, err := ManagedIdentity(inst, TagNodesIdentity, nil)
		assert.ErrorContains(t, err, "names no managed identity of its group", bad)
	}
}
