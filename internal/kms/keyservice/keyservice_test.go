package keyservice

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/openconstellation/constellation/internal/kms"
	"github.com/openconstellation/constellation/internal/pki"
)

const (
	diskUUID    = "2f4a1c9e-8b7d-4e21-9a3c-5d6e7f809a1b"
	volumeID    = "vol-0123456789abcdef0123456789abcdef"
	volumeKeyID = "volume-" + volumeID
)

type fixture struct {
	secret   kms.MasterSecret
	addr     string
	caPool   *x509.CertPool
	ca       *pki.CA
	registry *prometheus.Registry
	srv      *Server
}

func tlsCert(t testing.TB, ca *pki.CA, l pki.Leaf) tls.Certificate {
	t.Helper()
	l.NotBefore, l.NotAfter = time.Now().Add(-time.Minute), time.Now().Add(time.Hour)
	cert, key, err := ca.NewLeaf(l)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: key, Leaf: cert}
}

func startServer(t testing.TB) *fixture {
	t.Helper()
	ca, err := pki.NewCA("key service CA", time.Now(), time.Hour)
	require.NoError(t, err)
	secret, err := kms.NewMasterSecret()
	require.NoError(t, err)
	policy, err := ParsePolicy([]byte(`{"clients": {
		"joinservice": {"keyIDPrefixes": ["measurementSecret"], "stateDiskKeys": true, "volumeKeys": true},
		"csi": {"keyIDPrefixes": ["csi-"], "stateDiskKeys": true}}}`))
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	srv, err := NewServer(secret, policy, nil, reg)
	require.NoError(t, err)

	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	serverCert := tlsCert(t, ca, pki.Leaf{CommonName: "keyservice", DNSNames: []string{"keyservice"}, Server: true})
	g := grpc.NewServer(grpc.Creds(credentials.NewTLS(ServerTLS(serverCert, pool))))
	srv.Register(g)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	return &fixture{secret: secret, addr: ln.Addr().String(), caPool: pool, ca: ca, registry: reg, srv: srv}
}

func (f *fixture) client(t testing.TB, cert tls.Certificate) *Client {
	t.Helper()
	c, err := NewClient(f.addr, "keyservice", cert, f.caPool)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

func TestGetDataKey(t *testing.T) {
	f := startServer(t)
	joinservice := f.client(t, tlsCert(t, f.ca, pki.Leaf{CommonName: "joinservice", Client: true}))
	csi := f.client(t, tlsCert(t, f.ca, pki.Leaf{CommonName: "csi", Client: true}))
	stranger := f.client(t, tlsCert(t, f.ca, pki.Leaf{CommonName: "stranger", Client: true}))
	otherCA, err := pki.NewCA("attacker CA", time.Now(), time.Hour)
	require.NoError(t, err)
	forged := f.client(t, tlsCert(t, otherCA, pki.Leaf{CommonName: "joinservice", Client: true}))

	testCases := map[string]struct {
		client   *Client
		id       string
		length   int
		wantCode codes.Code
		wantMsg  string
	}{
		"measurement secret":   {client: joinservice, id: "measurementSecret", length: 32},
		"state-disk key":       {client: joinservice, id: diskUUID, length: 64},
		"prefix grant":         {client: csi, id: "csi-volume-7", length: 32},
		"volume key":           {client: joinservice, id: volumeKeyID, length: 32},
		"disk key not granted": {client: stranger, id: diskUUID, length: 32, wantCode: codes.PermissionDenied, wantMsg: `client "stranger" may not derive key`},
		// Volume keys go to the join service only: another client, even one granted
		// state-disk keys and a prefix, is refused.
		"volume key, other client":      {client: csi, id: volumeKeyID, length: 32, wantCode: codes.PermissionDenied, wantMsg: `client "csi" may not derive key "volume-vol-`},
		"volume key, unknown client":    {client: stranger, id: volumeKeyID, length: 32, wantCode: codes.PermissionDenied, wantMsg: `client "stranger"`},
		"volume key of a malformed id":  {client: joinservice, id: "volume-vol-XYZ", length: 32, wantCode: codes.PermissionDenied},
		"other prefix not granted":      {client: joinservice, id: "csi-volume-7", length: 32, wantCode: codes.PermissionDenied},
		"upper-case UUID is no disk id": {client: joinservice, id: "2F4A1C9E-8B7D-4E21-9A3C-5D6E7F809A1B", length: 32, wantCode: codes.PermissionDenied},
		"unknown client":                {client: stranger, id: "measurementSecret", length: 32, wantCode: codes.PermissionDenied, wantMsg: `client "stranger"`},
		"empty id":                      {client: joinservice, id: "", length: 32, wantCode: codes.InvalidArgument, wantMsg: "key id"},
		"id with spaces":                {client: joinservice, id: "measurement Secret", length: 32, wantCode: codes.InvalidArgument},
		"id too long":                   {client: csi, id: "csi-" + string(make([]byte, 200)), length: 32, wantCode: codes.InvalidArgument},
		"length zero":                   {client: joinservice, id: "measurementSecret", length: 0, wantCode: codes.InvalidArgument, wantMsg: "key length 0 out of range 16..512"},
		"length too short":              {client: joinservice, id: "measurementSecret", length: 8, wantCode: codes.InvalidArgument},
		"length too long":               {client: joinservice, id: "measurementSecret", length: 513, wantCode: codes.InvalidArgument},
		"certificate from another CA":   {client: forged, id: "measurementSecret", length: 32, wantCode: codes.Unavailable},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			key, err := tc.client.DataKey(ctx, tc.id, tc.length)
			if tc.wantCode != codes.OK {
				require.Error(t, err)
				assert.Equal(t, tc.wantCode, status.Code(err), "%v", err)
				assert.ErrorContains(t, err, tc.wantMsg)
				assert.Nil(t, key)
				return
			}
			require.NoError(t, err)
			want, err := f.secret.DeriveKey(tc.id, tc.length)
			require.NoError(t, err)
			assert.Equal(t, want, key)
		})
	}
	// The forged certificate never reached the service: 4 + 7 + 6 requests were counted.
	requests := f.srv.metrics.requests
	assert.Equal(t, 4.0, testutil.ToFloat64(requests.WithLabelValues("ok")))
	assert.Equal(t, 7.0, testutil.ToFloat64(requests.WithLabelValues("PermissionDenied")))
	assert.Equal(t, 6.0, testutil.ToFloat64(requests.WithLabelValues("InvalidArgument")))
	assert.Equal(t, 3, testutil.CollectAndCount(requests))
	n, err := testutil.GatherAndCount(f.registry, "constellation_keyservice_request_duration_seconds")
	require.NoError(t, err)
	assert.Equal(t, 1, n)
}

// A caller without a client certificate never reaches the service.
func TestNoClientCertificate(t *testing.T) {
	f := startServer(t)
	c := f.client(t, tls.Certificate{})
	_, err := c.DataKey(context.Background(), "measurementSecret", 32)
	require.Error(t, err)
	assert.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
}

func TestParsePolicy(t *testing.T) {
	testCases := map[string]struct {
		json    string
		wantErr string
	}{
		"valid":            {json: `{"clients":{"a":{"keyIDPrefixes":["x-"]}}}`},
		"disk keys only":   {json: `{"clients":{"a":{"stateDiskKeys":true}}}`},
		"volume keys only": {json: `{"clients":{"a":{"volumeKeys":true}}}`},
		// Volume keys are granted by volumeKeys alone: a prefix that could reach them is
		// refused, so the policy names every caller of volume keys in one field.
		"prefix of volume key ids":     {json: `{"clients":{"a":{"keyIDPrefixes":["volume-"]}}}`, wantErr: "could match volume key ids"},
		"longer prefix of volume ids":  {json: `{"clients":{"a":{"keyIDPrefixes":["volume-vol-0"]}}}`, wantErr: "could match volume key ids"},
		"shorter prefix of volume ids": {json: `{"clients":{"a":{"keyIDPrefixes":["vol"]}}}`, wantErr: "could match volume key ids"},
		"unknown field":                {json: `{"clients":{"a":{"keyIdPrefix":["x-"]}}}`, wantErr: "unknown field"},
		"no clients":                   {json: `{"clients":{}}`, wantErr: "no clients"},
		"empty prefix":                 {json: `{"clients":{"a":{"keyIDPrefixes":[""]}}}`, wantErr: "would grant every key id"},
		"grants nothing":               {json: `{"clients":{"a":{}}}`, wantErr: `client "a" is granted nothing`},
		"empty name":                   {json: `{"clients":{"":{"stateDiskKeys":true}}}`, wantErr: "empty name"},
		"trailing data":                {json: `{"clients":{"a":{"stateDiskKeys":true}}} {}`, wantErr: "data after the JSON value"},
		"stray brace":                  {json: `{"clients":{"a":{"stateDiskKeys":true}}}}`, wantErr: "data after the JSON value"},
		"stray bracket":                {json: `{"clients":{"a":{"stateDiskKeys":true}}}]`, wantErr: "data after the JSON value"},
		"not JSON":                     {json: `clients: a`, wantErr: "policy"},
		// One reading only: encoding/json alone kept the last client "a" and read
		// "StateDiskKeys" as stateDiskKeys.
		"client twice":        {json: `{"clients":{"a":{"keyIDPrefixes":["x-"]},"a":{"stateDiskKeys":true}}}`, wantErr: `duplicate member name "a"`},
		"grant in other case": {json: `{"clients":{"a":{"keyIDPrefixes":["x-"],"StateDiskKeys":true}}}`, wantErr: "letter case"},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			_, err := ParsePolicy([]byte(tc.json))
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tc.wantErr)
		})
	}
}

// A Policy built in code, past Validate, with a prefix covering volume key ids still grants
// no volume key: only VolumeKeys does. The default policy grants them to the join service
// and to nobody else.
func TestVolumeKeysOnlyByTheirGrant(t *testing.T) {
	p := Policy{Clients: map[string]Grant{
		"prefix": {KeyIDPrefixes: []string{"volume-"}},
		"disks":  {StateDiskKeys: true},
		"vols":   {VolumeKeys: true},
	}}
	assert.False(t, p.Allows("prefix", volumeKeyID))
	assert.False(t, p.Allows("disks", volumeKeyID))
	assert.True(t, p.Allows("vols", volumeKeyID))
	assert.False(t, p.Allows("vols", diskUUID), "volumeKeys grants volume keys only")
	assert.False(t, p.Allows("vols", "volume-vol-0123"), "nor ids of another form")

	def := DefaultPolicy()
	require.NoError(t, def.Validate())
	assert.True(t, def.Allows(JoinServiceClient, volumeKeyID))
	for name, g := range def.Clients {
		if name != JoinServiceClient {
			assert.False(t, g.VolumeKeys, "client %q", name)
		}
	}
	assert.False(t, def.Allows("csidriver", volumeKeyID))
}

func FuzzParsePolicy(f *testing.F) {
	f.Add([]byte(`{"clients":{"joinservice":{"keyIDPrefixes":["measurementSecret"],"stateDiskKeys":true}}}`))
	f.Add([]byte(`{"clients":{"joinservice":{"keyIDPrefixes":["measurementSecret"],"stateDiskKeys":true,"volumeKeys":true}}}`))
	f.Add([]byte(`{"clients":{"a":{"keyIDPrefixes":["volume-"]}}}`))
	f.Add([]byte(`{"clients":{"a":{"keyIDPrefixes":[""]}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := ParsePolicy(data)
		if err != nil {
			return
		}
		// A valid policy never grants an unlisted client, nor an invalid id.
		require.False(t, p.Allows("\x00unlisted", "measurementSecret"))
		for name := range p.Clients {
			require.False(t, p.Allows(name, "") && ValidKeyID("") == nil)
			// Volume keys by their own grant only, whatever the prefixes.
			require.Equal(t, p.Clients[name].VolumeKeys, p.Allows(name, volumeKeyID))
		}
	})
}
