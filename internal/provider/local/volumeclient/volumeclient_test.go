package volumeclient_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/csidriver"
	"github.com/openconstellation/constellation/internal/provider/local/metaserver"
	"github.com/openconstellation/constellation/internal/provider/local/volumeclient"
	"github.com/openconstellation/constellation/internal/provider/local/volumestore"
)

var (
	idA = csidriver.IDFor("pvc-a")
	idB = csidriver.IDFor("pvc-b")
)

const mib = 1 << 20

// fromAddr is an HTTP client whose requests leave from ip: the test's node.
func fromAddr(t *testing.T, ip string) *http.Client {
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	c := &http.Client{Transport: &http.Transport{DialContext: dialer.DialContext}, Timeout: 10 * time.Second}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// TestRoundTrip drives the real metadata server and volume store through the client: the
// controller's calls from a control plane, a node's device lookup from the node.
func TestRoundTrip(t *testing.T) {
	ctx := context.Background()
	srv := metaserver.New([]metaserver.Node{
		{Name: "control-plane-0", Role: "control-plane", IPs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}},
		{Name: "worker-0", Role: "worker", IPs: []netip.Addr{netip.MustParseAddr("127.0.0.2")}},
		{Name: "worker-1", Role: "worker", IPs: []netip.Addr{netip.MustParseAddr("127.0.0.3")}},
	}, nil, nil)
	store, err := volumestore.Open(filepath.Join(t.TempDir(), "volumes"))
	require.NoError(t, err)
	srv.SetVolumes(store)
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)

	cp := volumeclient.New(ts.URL) // from 127.0.0.1: the control plane
	worker0 := volumeclient.New(ts.URL)
	worker0.SetHTTPClient(fromAddr(t, "127.0.0.2"))
	worker1 := volumeclient.New(ts.URL)
	worker1.SetHTTPClient(fromAddr(t, "127.0.0.3"))

	v, err := cp.Create(ctx, idA, mib)
	require.NoError(t, err)
	assert.Equal(t, csidriver.Volume{ID: idA, Bytes: mib}, v)
	v, err = cp.Create(ctx, idA, mib)
	require.NoError(t, err, "a retried create")
	assert.Equal(t, csidriver.Volume{ID: idA, Bytes: mib}, v)
	_, err = cp.Create(ctx, idA, 2*mib)
	assert.ErrorIs(t, err, csidriver.ErrExists)
	_, err = cp.Get(ctx, idB)
	assert.ErrorIs(t, err, csidriver.ErrNotFound)

	require.NoError(t, cp.Attach(ctx, idA, "worker-0"))
	require.NoError(t, cp.Attach(ctx, idA, "worker-0"), "attached already")
	err = cp.Attach(ctx, idA, "worker-1")
	var elsewhere *csidriver.AttachedElsewhereError
	require.ErrorAs(t, err, &elsewhere)
	assert.Equal(t, &csidriver.AttachedElsewhereError{ID: idA, Node: "worker-0"}, elsewhere)
	assert.ErrorContains(t, cp.Attach(ctx, idA, "worker-9"), "the platform has no node worker-9")
	assert.ErrorIs(t, cp.Delete(ctx, idA), csidriver.ErrAttached)

	dev, err := worker0.Device(ctx, idA)
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(store.Dir(), idA+".img"), dev)
	_, err = worker1.Device(ctx, idA)
	assert.ErrorIs(t, err, csidriver.ErrNotAttached, "another node's volume")
	_, err = worker0.Create(ctx, idB, mib)
	assert.ErrorContains(t, err, "only control planes change volumes")

	n, err := cp.Expand(ctx, idA, 3*mib)
	require.NoError(t, err)
	assert.Equal(t, int64(3*mib), n)
	n, err = cp.Expand(ctx, idA, mib)
	require.NoError(t, err)
	assert.Equal(t, int64(3*mib), n, "never shrinks")

	require.NoError(t, cp.Detach(ctx, idA, "worker-1"), "not attached there: nothing to do")
	require.NoError(t, cp.Detach(ctx, idA, "worker-0"))
	require.NoError(t, cp.Detach(ctx, idA, "worker-0"), "detached already")
	_, err = worker0.Device(ctx, idA)
	assert.ErrorIs(t, err, csidriver.ErrNotAttached)
	require.NoError(t, cp.Attach(ctx, idA, "worker-1"), "moves to another node")
	require.NoError(t, store.DetachNode("worker-1"))
	require.NoError(t, cp.Delete(ctx, idA))
	require.NoError(t, cp.Delete(ctx, idA), "deleted already")
	_, err = cp.Get(ctx, idA)
	assert.ErrorIs(t, err, csidriver.ErrNotFound)
}

// TestRetries: transient failures are retried within the deadline, definitive ones are not.
func TestRetries(t *testing.T) {
	for name, tc := range map[string]struct {
		answers  []string // status and body per attempt; the last repeats
		wantErr  string
		attempts int64
	}{
		"503 then success":     {answers: []string{"503 {}", "502 {}", `200 {"id":"` + idA + `","bytes":1}`}, attempts: 3},
		"500 until the end":    {answers: []string{`500 {"reason":"internal","message":"disk full"}`}, wantErr: "gave up after", attempts: -1},
		"400 is definitive":    {answers: []string{`400 {"reason":"bad-request","message":"no"}`}, wantErr: "400 Bad Request: no (bad-request)", attempts: 1},
		"403 is definitive":    {answers: []string{`403 {"reason":"forbidden","message":"not a control plane"}`}, wantErr: "not a control plane", attempts: 1},
		"404 without reason":   {answers: []string{`404 404 page not found`}, wantErr: "decoding the refusal", attempts: 1},
		"404 of a volume":      {answers: []string{`404 {"reason":"not-found","message":"gone"}`}, wantErr: "volume not found", attempts: 1},
		"reason, wrong status": {answers: []string{`409 {"reason":"not-found","message":"x"}`}, wantErr: "409 Conflict: x (not-found)", attempts: 1},
	} {
		t.Run(name, func(t *testing.T) {
			var n atomic.Int64
			ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				i := min(int(n.Add(1))-1, len(tc.answers)-1)
				status, body, _ := strings.Cut(tc.answers[i], " ")
				code := map[string]int{"200": 200, "400": 400, "403": 403, "404": 404, "409": 409, "500": 500, "502": 502, "503": 503}[status]
				w.WriteHeader(code)
				_, _ = w.Write([]byte(body))
			}))
			t.Cleanup(ts.Close)
			c := volumeclient.New(ts.URL)
			c.SetBackoff(time.Millisecond, 5*time.Millisecond)
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			_, err := c.Get(ctx, idA)
			if tc.wantErr == "" {
				require.NoError(t, err)
			} else {
				require.ErrorContains(t, err, tc.wantErr)
			}
			if tc.attempts > 0 {
				assert.Equal(t, tc.attempts, n.Load())
			} else {
				assert.Greater(t, n.Load(), int64(3), "retried until the deadline")
			}
		})
	}

	t.Run("connection refused until the provider listens", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := l.Addr().String()
		require.NoError(t, l.Close())
		c := volumeclient.New("http://" + addr)
		c.SetBackoff(10*time.Millisecond, 20*time.Millisecond)
		go func() {
			time.Sleep(100 * time.Millisecond)
			l, err := net.Listen("tcp", addr)
			if err != nil {
				return
			}
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				_, _ = w.Write([]byte(`{"id":"` + idA + `","bytes":5}`))
			})}
			t.Cleanup(func() { _ = srv.Close() })
			_ = srv.Serve(l)
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		v, err := c.Get(ctx, idA)
		require.NoError(t, err)
		assert.Equal(t, int64(5), v.Bytes)
	})
}

// TestRefusedAnswers: answers that are not what was asked for are errors, not values.
func TestRefusedAnswers(t *testing.T) {
	for name, tc := range map[string]struct {
		body    string
		call    func(*volumeclient.Client) error
		wantErr string
	}{
		"another volume":     {`{"id":"` + idB + `","bytes":1}`, get, "answered with volume"},
		"no size":            {`{"id":"` + idA + `"}`, get, "volume size 0"},
		"bad node":           {`{"id":"` + idA + `","bytes":1,"attachedTo":"a/b"}`, get, "attached to"},
		"duplicate field":    {`{"id":"` + idA + `","bytes":1,"bytes":2}`, get, "duplicate"},
		"create, other size": {`{"id":"` + idA + `","bytes":7}`, create, "the provider answered 7 bytes"},
		"expand, smaller":    {`{"bytes":1}`, expand, "the provider answered 1 bytes"},
		"expand, no bytes":   {`{}`, expand, "want bytes"},
		"path: relative":     {`{"path":"volumes/` + idA + `.img"}`, device, "clean absolute path"},
		"path: unclean":      {`{"path":"/v/../etc/` + idA + `.img"}`, device, "clean absolute path"},
		"path: another file": {`{"path":"/dev/sda"}`, device, "want the volume's file"},
		"path: other volume": {`{"path":"/v/` + idB + `.img"}`, device, "want the volume's file"},
		"path: oversized":    {`{"path":"/` + strings.Repeat("a", 20<<10) + `"}`, device, "answer larger than"},
		"not JSON":           {`<html>`, get, "decoding the volume"},
	} {
		t.Run(name, func(t *testing.T) {
			ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				_, _ = w.Write([]byte(tc.body))
			}))
			t.Cleanup(ts.Close)
			c := volumeclient.New(ts.URL)
			require.ErrorContains(t, tc.call(c), tc.wantErr)
		})
	}
}

func get(c *volumeclient.Client) error {
	_, err := c.Get(context.Background(), idA)
	return err
}

func create(c *volumeclient.Client) error {
	_, err := c.Create(context.Background(), idA, 1)
	return err
}

func expand(c *volumeclient.Client) error {
	_, err := c.Expand(context.Background(), idA, 2)
	return err
}

func device(c *volumeclient.Client) error {
	_, err := c.Device(context.Background(), idA)
	return err
}

// TestRequestsChecked: the client sends nothing for a bad id, size, node or URL.
func TestRequestsChecked(t *testing.T) {
	ctx := context.Background()
	c := volumeclient.New("http://127.0.0.1:1")
	_, err := c.Create(ctx, "../x", 1)
	assert.ErrorContains(t, err, "volume id")
	_, err = c.Create(ctx, idA, 0)
	assert.ErrorContains(t, err, "volume size 0")
	assert.ErrorContains(t, c.Attach(ctx, idA, "a/../b"), "node name")
	assert.ErrorContains(t, c.Detach(ctx, idA, ""), "node name")
	_, err = c.Device(ctx, "vol-")
	assert.ErrorContains(t, err, "volume id")
	for _, bad := range []string{"ftp://10.42.0.1", "http://10.42.0.1/api", "http://u:p@10.42.0.1", "::"} {
		_, err := volumeclient.New(bad).Get(ctx, idA)
		assert.ErrorContains(t, err, "metadata service URL", bad)
	}
}

func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"id":"` + idA + `","bytes":1048576,"attachedTo":"worker-0"}`,
		`{"id":"` + idA + `","bytes":1}`,
		`{"bytes":3145728}`,
		`{"path":"/w/mini/volumes/` + idA + `.img"}`,
		`{"reason":"attached-elsewhere","node":"worker-0","message":"volume is attached to node worker-0"}`,
		`{"reason":"not-found","message":"gone"}`,
		`{"path":"/a/../` + idA + `.img"}`, `{"bytes":-1}`, `null`, `{}`, `[]`, `{"id":null}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if e, err := volumeclient.DecodeError(data); err == nil {
			assert.NotEmpty(t, e.Reason)
			if e.Node != "" {
				assert.NoError(t, volumestore.CheckNode(e.Node))
			}
		}
		if v, err := volumeclient.DecodeVolume(data, idA); err == nil {
			assert.Equal(t, idA, v.ID)
			assert.True(t, v.Bytes >= 1 && v.Bytes <= volumestore.MaxBytes)
		}
		if n, err := volumeclient.DecodeSize(data); err == nil {
			assert.True(t, n >= 1 && n <= volumestore.MaxBytes)
		}
		if p, err := volumeclient.DecodePath(data, idA); err == nil {
			assert.True(t, filepath.IsAbs(p))
			assert.Equal(t, filepath.Clean(p), p)
			assert.Equal(t, idA+".img", filepath.Base(p))
		}
	})
}
