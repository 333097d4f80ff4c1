package tdx

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/go-tdx-guest/abi"
	"github.com/google/go-tdx-guest/pcs"
	pb "github.com/google/go-tdx-guest/proto/tdx"
	tdxtesting "github.com/google/go-tdx-guest/testing"
	"github.com/google/go-tdx-guest/testing/testdata"
	"github.com/google/go-tdx-guest/verify"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
)

// fakeIntel is a stand-in for Intel's PKI: a root, the PCK platform CA, a PCK certificate
// (with the SGX extensions of the canned quote's real PCK certificate, so FMSPC and TCB
// are real), a TCB signing certificate, CRLs, and the canned TCB info and QE identity
// re-signed. It can produce quotes over any body, which the canned Intel quote cannot:
// its REPORTDATA is fixed, and its platform's TEE_TCB_SVN (03 00 04) is below the canned
// TCB info's lowest level (03 00 05), so it never passes the TCB status check.
//
// Only the package's tests can make VerifyQuote trust this root (VerifyOptions.roots is
// unexported); everything else runs exactly as in production.
type fakeIntel struct {
	root, platformCA, pck, tcbSigner     *x509.Certificate
	rootKey, platformKey, pckKey, tcbKey *ecdsa.PrivateKey
	responses                            map[string]tdxtesting.HTTPResponse
}

const fakeRootCRLURL = "https://fake-intel.test/IntelSGXRootCA.der"

func newFakeIntel(t testing.TB) *fakeIntel {
	t.Helper()
	f := &fakeIntel{}
	notBefore := time.Date(2023, 1, 1, 0, 0, 0, 0, time.UTC)
	notAfter := time.Date(2033, 1, 1, 0, 0, 0, 0, time.UTC)
	name := func(cn string) pkix.Name {
		return pkix.Name{CommonName: cn, Organization: []string{"Intel Corporation"}, Locality: []string{"Santa Clara"}, Province: []string{"CA"}, Country: []string{"US"}}
	}
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		return k
	}
	serial := int64(1)
	issue := func(tmpl *x509.Certificate, parent *x509.Certificate, key *ecdsa.PrivateKey, parentKey *ecdsa.PrivateKey) *x509.Certificate {
		serial++
		tmpl.SerialNumber = big.NewInt(serial)
		tmpl.NotBefore, tmpl.NotAfter = notBefore, notAfter
		tmpl.SignatureAlgorithm = x509.ECDSAWithSHA256
		if parent == nil {
			parent = tmpl
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
		require.NoError(t, err)
		cert, err := x509.ParseCertificate(der)
		require.NoError(t, err)
		return cert
	}
	f.rootKey, f.platformKey, f.pckKey, f.tcbKey = newKey(), newKey(), newKey(), newKey()
	f.root = issue(&x509.Certificate{
		Subject: name("Intel SGX Root CA"), IsCA: true, BasicConstraintsValid: true, MaxPathLen: 1,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign, CRLDistributionPoints: []string{fakeRootCRLURL},
	}, nil, f.rootKey, f.rootKey)
	f.platformCA = issue(&x509.Certificate{
		Subject: name("Intel SGX PCK Platform CA"), IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}, f.root, f.platformKey, f.rootKey)
	f.tcbSigner = issue(&x509.Certificate{
		Subject: name("Intel SGX TCB Signing"), BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature,
	}, f.root, f.tcbKey, f.rootKey)

	realChain, err := verify.ExtractChainFromQuote(mustParse(t, testdata.RawQuote))
	require.NoError(t, err)
	var sgxExt pkix.Extension
	for _, e := range realChain.PCKCertificate.Extensions {
		if e.Id.Equal(pcs.OidSgxExtension) {
			sgxExt = e
		}
	}
	require.NotNil(t, sgxExt.Value)
	f.pck = issue(&x509.Certificate{
		Subject: name("Intel SGX PCK Certificate"), BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtraExtensions: []pkix.Extension{sgxExt},
		// Intel's PCK certificates have exactly six extensions, and go-tdx-guest insists.
		SubjectKeyId: []byte{1, 2, 3, 4}, CRLDistributionPoints: []string{pcs.PckCrlURL("platform")},
	}, f.platformCA, f.pckKey, f.platformKey)

	crl := func(issuer *x509.Certificate, key *ecdsa.PrivateKey) []byte {
		der, err := x509.CreateRevocationList(rand.Reader, &x509.RevocationList{
			Number: big.NewInt(1), ThisUpdate: time.Date(2023, 6, 1, 0, 0, 0, 0, time.UTC),
			NextUpdate: time.Date(2023, 7, 8, 0, 0, 0, 0, time.UTC), SignatureAlgorithm: x509.ECDSAWithSHA256,
		}, issuer, key)
		require.NoError(t, err)
		return der
	}
	issuerChain := func(signer *x509.Certificate) []string {
		chain := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: signer.Raw})) +
			string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.root.Raw}))
		return []string{url.QueryEscape(chain)}
	}
	f.responses = map[string]tdxtesting.HTTPResponse{
		urlTCBInfo:     {Header: map[string][]string{pcs.TcbInfoIssuerChainPhrase: issuerChain(f.tcbSigner)}, Body: f.resign(t, upToDateTCBInfo(t, realChain.PCKCertificate), "tcbInfo")},
		urlQEIdentity:  {Header: map[string][]string{pcs.SgxQeIdentityIssuerChainPhrase: issuerChain(f.tcbSigner)}, Body: f.resign(t, testdata.QeIdentityBody, "enclaveIdentity")},
		urlPCKCRL:      {Header: map[string][]string{pcs.SgxPckCrlIssuerChainPhrase: issuerChain(f.platformCA)}, Body: crl(f.platformCA, f.platformKey)},
		fakeRootCRLURL: {Body: crl(f.root, f.rootKey)},
	}
	return f
}

// upToDateTCBInfo returns the canned TCB info with its UpToDate level lowered to the real
// PCK certificate's CPU SVNs (the canned platform's microcode is older than the level).
func upToDateTCBInfo(t testing.TB, pck *x509.Certificate) []byte {
	t.Helper()
	exts, err := pcs.PckCertificateExtensions(pck)
	require.NoError(t, err)
	var doc map[string]any
	require.NoError(t, json.Unmarshal(testdata.TcbInfoBody, &doc))
	level := doc["tcbInfo"].(map[string]any)["tcbLevels"].([]any)[0].(map[string]any)
	require.Equal(t, "UpToDate", level["tcbStatus"])
	for i, c := range level["tcb"].(map[string]any)["sgxtcbcomponents"].([]any) {
		c.(map[string]any)["svn"] = exts.TCB.CPUSvnComponents[i]
	}
	out, err := json.Marshal(doc)
	require.NoError(t, err)
	return out
}

// resign signs the object under field of an Intel JSON document with the fake TCB key.
func (f *fakeIntel) resign(t testing.TB, body []byte, field string) []byte {
	t.Helper()
	var doc map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(body, &doc))
	signed := doc[field]
	sig := f.signRaw(t, f.tcbKey, signed)
	out, err := json.Marshal(map[string]any{field: signed, "signature": hex.EncodeToString(sig)})
	require.NoError(t, err)
	return out
}

// signRaw returns Intel's raw r||s ECDSA P-256 signature over SHA-256(msg).
func (f *fakeIntel) signRaw(t testing.TB, key *ecdsa.PrivateKey, msg []byte) []byte {
	t.Helper()
	digest := sha256.Sum256(msg)
	r, s, err := ecdsa.Sign(rand.Reader, key, digest[:])
	require.NoError(t, err)
	out := make([]byte, 64)
	r.FillBytes(out[:32])
	s.FillBytes(out[32:])
	return out
}

// pcs returns a fake PCS serving this fake Intel's collateral.
func (f *fakeIntel) pcs() *fakePCS {
	p := &fakePCS{responses: map[string]tdxtesting.HTTPResponse{}, fetches: map[string]int{}}
	for u, r := range f.responses {
		p.responses[u] = tdxtesting.HTTPResponse{Header: r.Header, Body: bytes.Clone(r.Body)}
	}
	return p
}

func mustParse(t testing.TB, raw []byte) *pb.QuoteV4 {
	t.Helper()
	q, err := ParseQuote(raw)
	require.NoError(t, err)
	return q
}

// fakeTeeTcbSvn is at the canned TCB info's UpToDate level.
const fakeTeeTcbSvn = "03000500000000000000000000000000"

// quote returns a quote signed through the fake chain: the canned quote's header, QE
// report and body, with TEE_TCB_SVN at the UpToDate level, the given report data, and
// edit applied to the body.
func (f *fakeIntel) quote(t testing.TB, reportData []byte, edit func(*pb.TDQuoteBody)) []byte {
	t.Helper()
	q := proto.Clone(mustParse(t, testdata.RawQuote)).(*pb.QuoteV4)
	body := q.GetTdQuoteBody()
	body.TeeTcbSvn = mustHex(t, fakeTeeTcbSvn)
	body.ReportData = bytes.Clone(reportData)
	if edit != nil {
		edit(body)
	}

	ak, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	akRaw := make([]byte, 64)
	ak.X.FillBytes(akRaw[:32])
	ak.Y.FillBytes(akRaw[32:])

	sd := q.GetSignedData()
	sd.EcdsaAttestationKey = akRaw
	qeCert := sd.GetCertificationData().GetQeReportCertificationData()
	qeDigest := sha256.Sum256(append(bytes.Clone(akRaw), qeCert.GetQeAuthData().GetData()...))
	qeCert.QeReport.ReportData = append(qeDigest[:], make([]byte, 32)...)
	qeReport, err := abi.EnclaveReportToAbiBytes(qeCert.GetQeReport())
	require.NoError(t, err)
	qeCert.QeReportSignature = f.signRaw(t, f.pckKey, qeReport)

	var chain []byte
	for _, c := range []*x509.Certificate{f.pck, f.platformCA, f.root} {
		chain = append(chain, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	qeCert.PckCertificateChainData.PckCertChain = chain
	qeCert.PckCertificateChainData.Size = uint32(len(chain))
	certDataSize := 384 + 64 + 2 + len(qeCert.GetQeAuthData().GetData()) + 6 + len(chain)
	sd.CertificationData.Size = uint32(certDataSize)
	q.SignedDataSize = uint32(128 + 6 + certDataSize)
	q.ExtraBytes = nil

	header, err := abi.HeaderToAbiBytes(q.GetHeader())
	require.NoError(t, err)
	bodyRaw, err := abi.TdQuoteBodyToAbiBytes(body)
	require.NoError(t, err)
	sd.Signature = f.signRaw(t, ak, append(header, bodyRaw...))

	raw, err := abi.QuoteToAbiBytes(q)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(raw[:2]), "\x04\x00"))
	return raw
}
