// Package pki holds the certificate authorities of the project: creating, encoding, loading and
// signing from them (the platform's AK CA builds on it too), and the cluster's CAs in kubeadm's
// on-disk layout (/etc/kubernetes/pki) with kubeadm's CA discovery hash.
//
// The join service reads the cluster CAs from that layout (it runs next to the control plane
// that kubeadm created); the Kubernetes test harness writes it. New keys are ECDSA P-256:
// kubeadm supports them (ClusterConfiguration encryptionAlgorithm ECDSA-P256) and they are much
// cheaper to create and use than RSA. Every CA here issues only leaf certificates, so CA
// certificates carry path length zero.
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/openconstellation/constellation/internal/fileutil"
)

// File names in kubeadm's PKI directory.
const (
	CACert            = "ca.crt"
	CAKey             = "ca.key"
	ServiceAccountKey = "sa.key"
	ServiceAccountPub = "sa.pub"
	FrontProxyCACert  = "front-proxy-ca.crt"
	FrontProxyCAKey   = "front-proxy-ca.key"
	EtcdCACert        = "etcd/ca.crt"
	EtcdCAKey         = "etcd/ca.key"
)

// ControlPlaneFiles are the files every control-plane node must share (what `kubeadm init
// phase upload-certs` distributes): the CAs and the service-account signing key. Each node
// creates its own leaf certificates from them.
var ControlPlaneFiles = []string{CACert, CAKey, ServiceAccountKey, ServiceAccountPub, FrontProxyCACert, FrontProxyCAKey, EtcdCACert, EtcdCAKey}

// CA is a certificate authority with its key.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// NewCA creates a self-signed CA valid for validity from now.
func NewCA(commonName string, now time.Time, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	cert, err := sign(tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key}, nil
}

// Leaf describes a certificate to issue.
type Leaf struct {
	CommonName    string
	Organizations []string
	DNSNames      []string
	IPs           []net.IP
	Client        bool
	Server        bool
	NotBefore     time.Time
	NotAfter      time.Time
}

// Issue signs a certificate for pub.
func (ca *CA) Issue(l Leaf, pub crypto.PublicKey) (*x509.Certificate, error) {
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: l.CommonName, Organization: l.Organizations},
		DNSNames:    l.DNSNames,
		IPAddresses: l.IPs,
		NotBefore:   l.NotBefore,
		NotAfter:    l.NotAfter,
		KeyUsage:    x509.KeyUsageDigitalSignature,
	}
	if _, ok := pub.(*rsa.PublicKey); ok { // RSA keys also encipher keys in TLS 1.2
		tmpl.KeyUsage |= x509.KeyUsageKeyEncipherment
	}
	if l.Client {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	if l.Server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	return ca.Sign(tmpl, pub)
}

// Sign issues a certificate from tmpl for pub, with a random serial number. For certificates
// Leaf cannot describe (the AK CA's).
func (ca *CA) Sign(tmpl *x509.Certificate, pub crypto.PublicKey) (*x509.Certificate, error) {
	return sign(tmpl, ca.Cert, pub, ca.Key)
}

// Pool returns a pool holding only this CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// NewLeaf creates a key and a certificate for it.
func (ca *CA) NewLeaf(l Leaf) (*x509.Certificate, crypto.Signer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	cert, err := ca.Issue(l, key.Public())
	return cert, key, err
}

func sign(tmpl, parent *x509.Certificate, pub crypto.PublicKey, key crypto.Signer) (*x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	tmpl.SerialNumber = serial
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, key)
	if err != nil {
		return nil, fmt.Errorf("signing certificate for %q: %w", tmpl.Subject.CommonName, err)
	}
	return x509.ParseCertificate(der)
}

// DiscoveryHash returns kubeadm's --discovery-token-ca-cert-hash for cert: "sha256:" and the
// hex SHA-256 of its SubjectPublicKeyInfo (a pin of the key, not of the certificate).
func DiscoveryHash(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// EncodeCert returns cert as PEM.
func EncodeCert(cert *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})
}

// EncodeKey returns key as PKCS#8 PEM ("PRIVATE KEY"), which kubeadm and Go both read.
func EncodeKey(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// EncodePublicKey returns pub as PKIX PEM ("PUBLIC KEY"), the format of sa.pub.
func EncodePublicKey(pub crypto.PublicKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), nil
}

// ParseCert parses one PEM certificate.
func ParseCert(data []byte) (*x509.Certificate, error) {
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM CERTIFICATE block")
	}
	return x509.ParseCertificate(block.Bytes)
}

// ParseKey parses a PEM private key in PKCS#8, SEC 1 (EC) or PKCS#1 (RSA) form, the forms
// kubeadm writes.
func ParseKey(data []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM block")
	}
	var key any
	var err error
	switch block.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	default:
		return nil, fmt.Errorf("unexpected PEM block %q", block.Type)
	}
	if err != nil {
		return nil, err
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("key of type %T cannot sign", key)
	}
	return signer, nil
}

// LoadCA reads the CA certificate and key at certPath and keyPath (ParseCA).
func LoadCA(certPath, keyPath string) (*CA, error) {
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, err
	}
	ca, err := ParseCA(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%s, %s: %w", certPath, keyPath, err)
	}
	return ca, nil
}

// ParseCA parses a PEM CA certificate and its PEM key, and checks they belong together.
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	cert, err := ParseCert(certPEM)
	if err != nil {
		return nil, fmt.Errorf("certificate: %w", err)
	}
	key, err := ParseKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("key: %w", err)
	}
	pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(cert.PublicKey) {
		return nil, errors.New("the key does not belong to the certificate")
	}
	if !cert.IsCA {
		return nil, errors.New("not a CA certificate")
	}
	return &CA{Cert: cert, Key: key}, nil
}

// WriteFile writes data under dir/name (creating parent directories), keys with mode 0600.
// The write is atomic and synced (fileutil.WriteAtomic): a crash leaves the old file or the
// new one, never a torn key or certificate.
func WriteFile(dir, name string, data []byte) error {
	path := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	mode := os.FileMode(0o644)
	if filepath.Ext(name) == ".key" {
		mode = 0o600
	}
	if err := fileutil.WriteAtomic(path, data, mode); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// WriteCertAndKey writes cert and key as dir/name.crt and dir/name.key.
func WriteCertAndKey(dir, name string, cert *x509.Certificate, key crypto.Signer) error {
	keyPEM, err := EncodeKey(key)
	if err != nil {
		return err
	}
	if err := WriteFile(dir, name+".key", keyPEM); err != nil {
		return err
	}
	return WriteFile(dir, name+".crt", EncodeCert(cert))
}

// Cluster is the set of CAs and keys kubeadm creates for a new cluster.
type Cluster struct {
	CA, FrontProxyCA, EtcdCA *CA
	ServiceAccountKey        crypto.Signer
}

// NewCluster creates the CAs and the service-account key of a new cluster.
func NewCluster(now time.Time) (*Cluster, error) {
	var c Cluster
	var err error
	// kubeadm's CA names and its 10-year CA validity.
	const caValidity = 10 * 365 * 24 * time.Hour
	if c.CA, err = NewCA("kubernetes", now, caValidity); err != nil {
		return nil, err
	}
	if c.FrontProxyCA, err = NewCA("front-proxy-ca", now, caValidity); err != nil {
		return nil, err
	}
	if c.EtcdCA, err = NewCA("etcd-ca", now, caValidity); err != nil {
		return nil, err
	}
	if c.ServiceAccountKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		return nil, err
	}
	return &c, nil
}

// Write stores the CAs and the service-account key pair in dir in kubeadm's layout.
func (c *Cluster) Write(dir string) error {
	files := map[string][]byte{
		CACert:            EncodeCert(c.CA.Cert),
		FrontProxyCACert:  EncodeCert(c.FrontProxyCA.Cert),
		EtcdCACert:        EncodeCert(c.EtcdCA.Cert),
		ServiceAccountPub: nil,
	}
	for name, signer := range map[string]crypto.Signer{CAKey: c.CA.Key, FrontProxyCAKey: c.FrontProxyCA.Key, EtcdCAKey: c.EtcdCA.Key, ServiceAccountKey: c.ServiceAccountKey} {
		data, err := EncodeKey(signer)
		if err != nil {
			return err
		}
		files[name] = data
	}
	pub, err := EncodePublicKey(c.ServiceAccountKey.Public())
	if err != nil {
		return err
	}
	files[ServiceAccountPub] = pub
	for name, data := range files {
		if err := WriteFile(dir, name, data); err != nil {
			return err
		}
	}
	return nil
}

// ReadControlPlaneFiles reads ControlPlaneFiles from dir. Every file must exist.
func ReadControlPlaneFiles(dir string) (map[string][]byte, error) {
	out := make(map[string][]byte, len(ControlPlaneFiles))
	for _, name := range ControlPlaneFiles {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("control-plane file: %w", err)
		}
		out[name] = data
	}
	return out, nil
}
