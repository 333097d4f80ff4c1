package kubeletcsr

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/pki"
)

var node = Node{Name: "worker-1", Addresses: []netip.Addr{netip.MustParseAddr("10.42.0.3"), netip.MustParseAddr("fd00::3")}}

func request(t testing.TB, key crypto.Signer, mutate func(*x509.CertificateRequest)) []byte {
	t.Helper()
	tmpl := &x509.CertificateRequest{
		Subject:     pkix.Name{CommonName: "system:node:worker-1", Organization: []string{"system:nodes"}},
		DNSNames:    []string{"worker-1"},
		IPAddresses: []net.IP{net.ParseIP("10.42.0.3"), net.ParseIP("fd00::3")},
	}
	if mutate != nil {
		mutate(tmpl)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	require.NoError(t, err)
	return der
}

func TestCheck(t *testing.T) {
	p256, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	p224, err := ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
	require.NoError(t, err)
	rsa1024, err := rsa.GenerateKey(rand.Reader, 1024)
	require.NoError(t, err)
	_, ed, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)

	good := request(t, p256, nil)
	badSig := append([]byte(nil), good...)
	badSig[len(badSig)-3] ^= 0xff

	testCases := map[string]struct {
		der     []byte
		wantErr string
	}{
		"valid":                      {der: good},
		"valid without SANs":         {der: request(t, p256, func(r *x509.CertificateRequest) { r.DNSNames, r.IPAddresses = nil, nil })},
		"valid with a subset of IPs": {der: request(t, p256, func(r *x509.CertificateRequest) { r.IPAddresses = r.IPAddresses[:1] })},
		"empty":                      {der: nil, wantErr: "empty"},
		"garbage":                    {der: []byte("not a request"), wantErr: "parsing"},
		"oversized":                  {der: make([]byte, MaxRequestSize+1), wantErr: "limit"},
		"tampered signature":         {der: badSig, wantErr: "signature"},
		"another node's name": {
			der:     request(t, p256, func(r *x509.CertificateRequest) { r.Subject.CommonName = "system:node:worker-2" }),
			wantErr: `common name "system:node:worker-2", want "system:node:worker-1"`,
		},
		"no node prefix": {
			der:     request(t, p256, func(r *x509.CertificateRequest) { r.Subject.CommonName = "worker-1" }),
			wantErr: "common name",
		},
		"masters group": {
			der:     request(t, p256, func(r *x509.CertificateRequest) { r.Subject.Organization = []string{"system:nodes", "system:masters"} }),
			wantErr: "organization",
		},
		"extra subject field": {
			der:     request(t, p256, func(r *x509.CertificateRequest) { r.Subject.OrganizationalUnit = []string{"x"} }),
			wantErr: "fields besides CN and O",
		},
		"foreign IP SAN": {
			der:     request(t, p256, func(r *x509.CertificateRequest) { r.IPAddresses = append(r.IPAddresses, net.ParseIP("10.42.0.9")) }),
			wantErr: "IP address 10.42.0.9 is not one of the node's addresses",
		},
		"loopback IP SAN": {
			der:     request(t, p256, func(r *x509.CertificateRequest) { r.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")} }),
			wantErr: "IP address 127.0.0.1",
		},
		"foreign DNS SAN": {
			der:     request(t, p256, func(r *x509.CertificateRequest) { r.DNSNames = []string{"kubernetes.default"} }),
			wantErr: `DNS name "kubernetes.default"`,
		},
		"URI SAN": {
			der:     request(t, p256, func(r *x509.CertificateRequest) { r.URIs = []*url.URL{{Scheme: "spiffe", Host: "x"}} }),
			wantErr: "URI",
		},
		// A request whose strings are large: the error quotes 64 bytes of each and names at
		// most three offending SANs.
		"huge strings": {
			der: request(t, p256, func(r *x509.CertificateRequest) {
				r.Subject.CommonName = "system:node:" + strings.Repeat("x", 6000)
				r.Subject.Organization = []string{strings.Repeat("o", 2000), "system:masters"}
				for i := range 30 {
					r.DNSNames = append(r.DNSNames, fmt.Sprintf("%d.%s", i, strings.Repeat("d", 100)))
				}
			}),
			wantErr: `common name "system:node:xxxx`,
		},
		"weak curve":  {der: request(t, p224, nil), wantErr: "curve P-224"},
		"weak RSA":    {der: request(t, rsa1024, nil), wantErr: "RSA key of 1024 bits"},
		"ed25519 key": {der: request(t, ed, nil), wantErr: "key of type ed25519.PublicKey"},
		"every problem at once": {
			der: request(t, p256, func(r *x509.CertificateRequest) {
				r.Subject = pkix.Name{CommonName: "system:node:other", Organization: []string{"system:masters"}}
				r.IPAddresses = []net.IP{net.ParseIP("192.0.2.1")}
			}),
			wantErr: "common name \"system:node:other\", want \"system:node:worker-1\"\norganization [\"system:masters\"], want [\"system:nodes\"]\nIP address 192.0.2.1",
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			csr, err := CheckServing(tc.der, node)
			if err != nil {
				assert.Less(t, len(err.Error()), 1024, "the error echoes peer strings unbounded")
			}
			if tc.wantErr == "" {
				require.NoError(t, err)
				assert.Equal(t, "system:node:worker-1", csr.Subject.CommonName)
				return
			}
			require.ErrorIs(t, err, ErrRejected)
			assert.ErrorContains(t, err, tc.wantErr)
			assert.Nil(t, csr)
		})
	}
}

func TestCheckClient(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	client := func(mutate func(*x509.CertificateRequest)) []byte {
		return request(t, key, func(r *x509.CertificateRequest) {
			r.DNSNames, r.IPAddresses = nil, nil
			if mutate != nil {
				mutate(r)
			}
		})
	}
	own, err := ClientRequest("worker-1", key)
	require.NoError(t, err)
	testCases := map[string]struct {
		der     []byte
		wantErr string
	}{
		"valid":                  {der: client(nil)},
		"built by ClientRequest": {der: own},
		"another node's name": {
			der:     client(func(r *x509.CertificateRequest) { r.Subject.CommonName = "system:node:control-plane-0" }),
			wantErr: `common name "system:node:control-plane-0", want "system:node:worker-1"`,
		},
		"masters group": {
			der:     client(func(r *x509.CertificateRequest) { r.Subject.Organization = []string{"system:masters"} }),
			wantErr: `organization ["system:masters"], want ["system:nodes"]`,
		},
		"serving request's SANs": {der: request(t, key, nil), wantErr: "3 SANs in a client certificate request, want none"},
		"URI SAN": {
			der:     client(func(r *x509.CertificateRequest) { r.URIs = []*url.URL{{Scheme: "spiffe", Host: "x"}} }),
			wantErr: "1 SANs in a client certificate request",
		},
		"empty": {wantErr: "empty"},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			csr, err := CheckClient(tc.der, "worker-1")
			if tc.wantErr == "" {
				require.NoError(t, err)
				assert.Equal(t, "system:node:worker-1", csr.Subject.CommonName)
				return
			}
			require.ErrorIs(t, err, ErrRejected)
			assert.ErrorContains(t, err, tc.wantErr)
		})
	}
}

func TestIssue(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	ca, err := pki.NewCA("kubernetes", now, time.Hour*24*3650)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)

	servingDER, err := ServingRequest(node, key)
	require.NoError(t, err)
	servingCSR, err := CheckServing(servingDER, node)
	require.NoError(t, err)
	serving, err := IssueServing(ca, servingCSR, now)
	require.NoError(t, err)
	assert.Equal(t, "system:node:worker-1", serving.Subject.CommonName)
	assert.Equal(t, []string{"system:nodes"}, serving.Subject.Organization)
	assert.Equal(t, []string{"worker-1"}, serving.DNSNames)
	assert.Len(t, serving.IPAddresses, 2)
	assert.Equal(t, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, serving.ExtKeyUsage, "a serving certificate must not authenticate the node")
	assert.True(t, key.PublicKey.Equal(serving.PublicKey))
	assert.Equal(t, now.Add(ServingValidity), serving.NotAfter)
	_, err = serving.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	require.Error(t, err, "the serving certificate verifies for client authentication")

	clientDER, err := ClientRequest("worker-1", key)
	require.NoError(t, err)
	clientCSR, err := CheckClient(clientDER, "worker-1")
	require.NoError(t, err)
	client, err := IssueClient(ca, clientCSR, now)
	require.NoError(t, err)
	assert.Equal(t, "system:node:worker-1", client.Subject.CommonName)
	assert.Equal(t, []string{"system:nodes"}, client.Subject.Organization)
	assert.Empty(t, client.DNSNames)
	assert.Empty(t, client.IPAddresses)
	assert.Equal(t, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, client.ExtKeyUsage)
	assert.Equal(t, now.Add(ClientValidity), client.NotAfter)
	assert.Equal(t, now.Add(-backdate), client.NotBefore)
	_, err = client.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	require.NoError(t, err)
	_, err = client.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: now.Add(ClientValidity + time.Second), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	require.Error(t, err, "valid after ClientValidity")
}

// FuzzCheck: no input panics, and whatever passes names exactly the node and only its
// addresses (a client request: no addresses at all).
func FuzzCheck(f *testing.F) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(f, err)
	f.Add(request(f, key, nil))
	f.Add(request(f, key, func(r *x509.CertificateRequest) { r.IPAddresses = append(r.IPAddresses, net.ParseIP("10.0.0.1")) }))
	f.Add([]byte{0x30, 0x03, 0x02, 0x01, 0x00})
	f.Fuzz(func(t *testing.T, der []byte) {
		if csr, err := CheckClient(der, node.Name); err == nil {
			require.Equal(t, "system:node:worker-1", csr.Subject.CommonName)
			require.Equal(t, []string{"system:nodes"}, csr.Subject.Organization)
			require.Empty(t, csr.DNSNames)
			require.Empty(t, csr.IPAddresses)
		}
		csr, err := CheckServing(der, node)
		if err != nil {
			return
		}
		require.Equal(t, "system:node:worker-1", csr.Subject.CommonName)
		for _, ip := range csr.IPAddresses {
			addr, _ := netip.AddrFromSlice(ip)
			require.Contains(t, node.Addresses, addr.Unmap())
		}
	})
}
