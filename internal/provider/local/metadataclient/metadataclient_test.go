package metadataclient_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"

	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider/local/metadataclient"
)

var hash = func() string {
	h, err := bcrypt.GenerateFromPassword([]byte("init secret"), bcrypt.MinCost)
	if err != nil {
		panic(err)
	}
	return string(h)
}()

// api serves the given bodies by path, with status 200 unless the body starts with a status
// line like "404 ".
func api(t *testing.T, bodies map[string]string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			w.WriteHeader(http.StatusMethodNotAllowed)
			return
		}
		body, ok := bodies[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		switch {
		case strings.HasPrefix(body, "SLOW "):
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
			return
		case strings.HasPrefix(body, "REDIRECT "):
			http.Redirect(w, r, strings.TrimPrefix(body, "REDIRECT "), http.StatusFound)
			return
		case strings.HasPrefix(body, "500 "):
			w.WriteHeader(http.StatusInternalServerError)
			body = strings.TrimPrefix(body, "500 ")
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func client(t *testing.T, bodies map[string]string) *metadataclient.Client {
	t.Helper()
	c, err := metadataclient.New(api(t, bodies), nil)
	require.NoError(t, err)
	return c
}

func TestGenuineAnswers(t *testing.T) {
	c := client(t, map[string]string{
		"/v1/self":             `{"name":"control-plane-0","role":"control-plane","ips":["10.42.0.10"]}`,
		"/v1/instances":        `[{"name":"control-plane-0","role":"control-plane","ips":["10.42.0.10"]},{"name":"worker-0","role":"worker","ips":["10.42.0.11","fd00::11"],"future":"ignored"}]`,
		"/v1/join-endpoints":   `["10.42.0.10:30090","[fd00::10]:30090"]`,
		"/v1/init-secret-hash": `{"hash":"` + hash + `"}`,
		"/v1/api-endpoint":     `{"endpoint":"10.42.0.2:6443"}`,
	})
	ctx := context.Background()
	self, err := c.Self(ctx)
	require.NoError(t, err)
	assert.Equal(t, metadata.Instance{Name: "control-plane-0", Role: metadata.ControlPlane, IPs: []netip.Addr{netip.MustParseAddr("10.42.0.10")}}, self)

	list, err := c.Instances(ctx)
	require.NoError(t, err)
	assert.Equal(t, []metadata.Instance{
		self,
		{Name: "worker-0", Role: metadata.Worker, IPs: []netip.Addr{netip.MustParseAddr("10.42.0.11"), netip.MustParseAddr("fd00::11")}},
	}, list)

	eps, err := c.JoinEndpoints(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"10.42.0.10:30090", "[fd00::10]:30090"}, eps)

	h, err := c.InitSecretHash(ctx)
	require.NoError(t, err)
	assert.NoError(t, bcrypt.CompareHashAndPassword(h, []byte("init secret")))

	api, err := c.APIEndpoint(ctx)
	require.NoError(t, err)
	assert.Equal(t, "10.42.0.2:6443", api)
	none, err := client(t, map[string]string{"/v1/api-endpoint": `{"endpoint":""}`}).APIEndpoint(ctx)
	require.NoError(t, err)
	assert.Empty(t, none, "a platform without a load balancer")

	// No control plane yet: no endpoints, no error.
	empty := client(t, map[string]string{"/v1/join-endpoints": `[]`, "/v1/instances": `[]`})
	eps, err = empty.JoinEndpoints(ctx)
	require.NoError(t, err)
	assert.Empty(t, eps)
	list, err = empty.Instances(ctx)
	require.NoError(t, err)
	assert.Empty(t, list)
}

func TestRefusedAnswers(t *testing.T) {
	for name, tc := range map[string]struct {
		path, body string
		call       func(context.Context, *metadataclient.Client) error
		want       []string
	}{
		"self: not found":      {path: "/v1/other", body: `{}`, call: self, want: []string{"metadata /v1/self: 404 Not Found"}},
		"self: server error":   {path: "/v1/self", body: `500 {"error":"provider restarting"}`, call: self, want: []string{"500 Internal Server Error", "provider restarting"}},
		"self: not JSON":       {path: "/v1/self", body: `<html>`, call: self, want: []string{"decoding instance"}},
		"self: bad role":       {path: "/v1/self", body: `{"name":"n","role":"admin","ips":["10.42.0.10"]}`, call: self, want: []string{`role "admin"`}},
		"self: no name, no IP": {path: "/v1/self", body: `{"role":"worker"}`, call: self, want: []string{"no name", "no IP address"}},
		"self: bad IP":         {path: "/v1/self", body: `{"name":"n","role":"worker","ips":["10.42.0.300"]}`, call: self, want: []string{`IP address "10.42.0.300"`}},
		"self: unspecified IP": {path: "/v1/self", body: `{"name":"n","role":"worker","ips":["0.0.0.0"]}`, call: self, want: []string{"unusable IP address 0.0.0.0"}},
		"self: oversized":      {path: "/v1/self", body: `{"name":"` + strings.Repeat("n", 1<<20) + `"}`, call: self, want: []string{"larger than 1048576 bytes"}},
		"self: redirect":       {path: "/v1/self", body: `REDIRECT http://203.0.113.1/v1/self`, call: self, want: []string{"does not redirect"}},
		"instances: duplicate": {path: "/v1/instances", body: `[{"name":"a","role":"worker","ips":["10.42.0.11"]},{"name":"a","role":"worker","ips":["10.42.0.12"]}]`, call: instances, want: []string{`instance 1: name "a" listed twice`}},
		"instances: one bad": {
			path: "/v1/instances", body: `[{"name":"a","role":"worker","ips":["10.42.0.11"]},{"name":"b","role":"","ips":["10.42.0.12"]}]`,
			call: instances, want: []string{"instance 1:", `role ""`},
		},
		"instances: object":      {path: "/v1/instances", body: `{"name":"a"}`, call: instances, want: []string{"decoding instance list"}},
		"endpoints: no port":     {path: "/v1/join-endpoints", body: `["10.42.0.10"]`, call: endpoints, want: []string{`endpoint "10.42.0.10"`}},
		"endpoints: bad port":    {path: "/v1/join-endpoints", body: `["10.42.0.10:0"]`, call: endpoints, want: []string{"port of 1..65535"}},
		"endpoints: no host":     {path: "/v1/join-endpoints", body: `[":30090"]`, call: endpoints, want: []string{"port of 1..65535"}},
		"api: host name":         {path: "/v1/api-endpoint", body: `{"endpoint":"api.example:6443"}`, call: apiEndpoint, want: []string{"want IP:port"}},
		"api: no port":           {path: "/v1/api-endpoint", body: `{"endpoint":"10.42.0.2"}`, call: apiEndpoint, want: []string{"want IP:port"}},
		"api: port 0":            {path: "/v1/api-endpoint", body: `{"endpoint":"10.42.0.2:0"}`, call: apiEndpoint, want: []string{"want IP:port"}},
		"api: unspecified":       {path: "/v1/api-endpoint", body: `{"endpoint":"0.0.0.0:6443"}`, call: apiEndpoint, want: []string{"want IP:port"}},
		"api: no field":          {path: "/v1/api-endpoint", body: `{}`, call: apiEndpoint, want: []string{"no endpoint field"}},
		"api: unknown field":     {path: "/v1/api-endpoint", body: `{"endpoint":"10.42.0.2:6443","via":"x"}`, call: apiEndpoint, want: []string{"unknown field"}},
		"api: trailing data":     {path: "/v1/api-endpoint", body: `{"endpoint":"10.42.0.2:6443"}}`, call: apiEndpoint, want: []string{"data after the JSON value"}},
		"hash: not bcrypt":       {path: "/v1/init-secret-hash", body: `{"hash":"sha256:abcd"}`, call: initHash, want: []string{"not a bcrypt hash"}},
		"hash: missing":          {path: "/v1/init-secret-hash", body: `{}`, call: initHash, want: []string{"not a bcrypt hash"}},
		"hash: service too slow": {path: "/v1/init-secret-hash", body: `SLOW `, call: initHash, want: []string{"context deadline exceeded"}},
	} {
		t.Run(name, func(t *testing.T) {
			c := client(t, map[string]string{tc.path: tc.body})
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			err := tc.call(ctx, c)
			require.Error(t, err)
			for _, w := range tc.want {
				assert.ErrorContains(t, err, w)
			}
		})
	}
}

func self(ctx context.Context, c *metadataclient.Client) error {
	_, err := c.Self(ctx)
	return err
}

func instances(ctx context.Context, c *metadataclient.Client) error {
	_, err := c.Instances(ctx)
	return err
}

func endpoints(ctx context.Context, c *metadataclient.Client) error {
	_, err := c.JoinEndpoints(ctx)
	return err
}

func apiEndpoint(ctx context.Context, c *metadataclient.Client) error {
	_, err := c.APIEndpoint(ctx)
	return err
}

func initHash(ctx context.Context, c *metadataclient.Client) error {
	_, err := c.InitSecretHash(ctx)
	return err
}

func TestNew(t *testing.T) {
	for in, ok := range map[string]bool{
		metadataclient.DefaultURL: true, "https://meta.example:8443/": true,
		"ftp://10.42.0.1": false, "http://": false, "http://10.42.0.1/api": false, "http://10.42.0.1?x=1": false,
		"http://user:pw@10.42.0.1": false, "::": false,
	} {
		_, err := metadataclient.New(in, nil)
		assert.Equal(t, ok, err == nil, "%s: %v", in, err)
	}
	// An unreachable service fails within the context.
	c, err := metadataclient.New("http://127.0.0.1:1", nil)
	require.NoError(t, err)
	_, err = c.Self(context.Background())
	assert.ErrorContains(t, err, "metadata /v1/self")
}

func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"name":"n","role":"worker","ips":["10.42.0.10"]}`,
		`{"name":"n","role":"worker","ips":["10.42.0.10"],"podCIDR":"10.244.1.0/24","cgroupRoot":"/cmini-x/n/pods"}`,
		`[{"name":"a","role":"control-plane","ips":["10.42.0.11","fd00::1"]}]`,
		`["10.42.0.10:30090"]`, `{"endpoint":"10.42.0.2:6443"}`, `{"hash":"` + hash + `"}`, `null`, `[]`, `{}`, `[null]`, `[{"ips":null}]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if inst, err := metadataclient.DecodeSelf(data); err == nil {
			assert.NoError(t, inst.Validate())
		}
		if n, err := metadataclient.DecodeNode(data); err == nil {
			assert.NoError(t, n.Instance().Validate())
			assert.True(t, n.PodCIDR.IsValid())
		}
		if list, err := metadataclient.DecodeInstances(data); err == nil {
			names := map[string]bool{}
			for _, inst := range list {
				assert.NoError(t, inst.Validate())
				assert.False(t, names[inst.Name])
				names[inst.Name] = true
			}
		}
		_, _ = metadataclient.DecodeEndpoints(data)
		if ep, err := metadataclient.DecodeAPIEndpoint(data); err == nil && ep != "" {
			_, err := netip.ParseAddrPort(ep)
			assert.NoError(t, err)
		}
		if h, err := metadataclient.DecodeHash(data); err == nil {
			_, err := bcrypt.Cost(h)
			assert.NoError(t, err)
		}
	})
}
