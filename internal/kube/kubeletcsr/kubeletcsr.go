// Package kubeletcsr checks a joining node's certificate request for its kubelet and signs it.
//
// A request is untrusted input even from an attested node: the image is trusted, but the name
// and addresses it asks for must be the ones the platform attributes to that node, or one node
// could impersonate another to the API server (the Node authorizer trusts the certificate's
// name). Steps, in order: parse, verify the request's self-signature, validate it against
// the node's identity. Only then is a certificate issued.
package kubeletcsr

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/openconstellation/constellation/internal/pki"
	"github.com/openconstellation/constellation/pkg/untrusted"
)

// Kubernetes names of node identities.
const (
	NodeUserPrefix = "system:node:"
	NodesGroup     = "system:nodes"
)

// MaxRequestSize caps a DER request before parsing; a kubelet request is well under 1 KiB.
const MaxRequestSize = 16 << 10

// Validity of issued kubelet certificates, as kubeadm's leaf certificates.
const Validity = 365 * 24 * time.Hour

// ErrRejected is wrapped by every error about the request's content.
var ErrRejected = errors.New("kubelet certificate request rejected")

// Node is what the platform says about the node asking.
type Node struct {
	Name      string
	Addresses []netip.Addr
}

// Check parses and verifies der and validates it for node: subject exactly CN
// system:node:<name> and O system:nodes; DNS SANs only the node's name; IP SANs only the
// node's addresses; no other SANs; an ECDSA P-256/P-384 or RSA ≥ 2048 key.
func Check(der []byte, node Node) (*x509.CertificateRequest, error) {
	// 1. Parse.
	if len(der) == 0 {
		return nil, fmt.Errorf("%w: empty", ErrRejected)
	}
	if len(der) > MaxRequestSize {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrRejected, len(der), MaxRequestSize)
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return nil, fmt.Errorf("%w: parsing: %w", ErrRejected, err)
	}
	// 2. Verify: the requester holds the key.
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("%w: signature: %w", ErrRejected, err)
	}
	// 3. Validate against the node's identity.
	var problems []error
	// The CSR is the peer's: its strings are quoted and truncated (untrusted.Quote), and at
	// most maxListed offending SANs are named, so a crafted request cannot make the error
	// (the gRPC status and the log line) large.
	if want := NodeUserPrefix + node.Name; csr.Subject.CommonName != want {
		problems = append(problems, fmt.Errorf("common name %s, want %q", untrusted.Quote(csr.Subject.CommonName), want))
	}
	if !slices.Equal(csr.Subject.Organization, []string{NodesGroup}) {
		var orgs []string
		for _, o := range csr.Subject.Organization {
			orgs = append(orgs, untrusted.Quote(o))
		}
		problems = append(problems, fmt.Errorf("organization [%s], want [%q]", listed(orgs), NodesGroup))
	}
	s := csr.Subject
	if len(s.Country)+len(s.Province)+len(s.Locality)+len(s.StreetAddress)+len(s.PostalCode)+len(s.OrganizationalUnit)+len(s.ExtraNames) > 0 || s.SerialNumber != "" {
		problems = append(problems, errors.New("subject has fields besides CN and O"))
	}
	var badNames, badIPs []string
	for _, name := range csr.DNSNames {
		if name != node.Name {
			badNames = append(badNames, untrusted.Quote(name))
		}
	}
	if len(badNames) > 0 {
		problems = append(problems, fmt.Errorf("DNS name %s is not the node's name %q", listed(badNames), node.Name))
	}
	for _, ip := range csr.IPAddresses {
		addr, ok := netip.AddrFromSlice(ip)
		if !ok || !slices.Contains(node.Addresses, addr.Unmap()) {
			badIPs = append(badIPs, ip.String())
		}
	}
	if len(badIPs) > 0 {
		problems = append(problems, fmt.Errorf("IP address %s is not one of the node's addresses %v", listed(badIPs), node.Addresses))
	}
	if len(csr.EmailAddresses)+len(csr.URIs) > 0 {
		problems = append(problems, errors.New("e-mail or URI SANs requested"))
	}
	if err := checkKey(csr); err != nil {
		problems = append(problems, err)
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("%w for node %q: %w", ErrRejected, node.Name, errors.Join(problems...))
	}
	return csr, nil
}

// maxListed is how many offending SANs an error names.
const maxListed = 3

// listed joins the first maxListed items and counts the rest.
func listed(items []string) string {
	if len(items) <= maxListed {
		return strings.Join(items, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(items[:maxListed], ", "), len(items)-maxListed)
}

func checkKey(csr *x509.CertificateRequest) error {
	switch k := csr.PublicKey.(type) {
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() && k.Curve != elliptic.P384() {
			return fmt.Errorf("ECDSA key on curve %s", k.Curve.Params().Name)
		}
	case *rsa.PublicKey:
		if k.N.BitLen() < 2048 {
			return fmt.Errorf("RSA key of %d bits", k.N.BitLen())
		}
	default:
		return fmt.Errorf("key of type %T", k)
	}
	return nil
}

// Sign checks der for node (Check) and issues the kubelet's certificate (Issue).
func Sign(ca *pki.CA, der []byte, node Node, now time.Time) (*x509.Certificate, error) {
	csr, err := Check(der, node)
	if err != nil {
		return nil, err
	}
	return Issue(ca, csr, now)
}

// Issue issues the kubelet's certificate from ca for a request that passed Check: for client
// authentication to the API server and as the kubelet's serving certificate.
func Issue(ca *pki.CA, csr *x509.CertificateRequest, now time.Time) (*x509.Certificate, error) {
	ips := make([]net.IP, len(csr.IPAddresses))
	copy(ips, csr.IPAddresses)
	return ca.Issue(pki.Leaf{
		CommonName:    csr.Subject.CommonName,
		Organizations: []string{NodesGroup},
		DNSNames:      csr.DNSNames,
		IPs:           ips,
		Client:        true,
		Server:        true,
		// A little backdating tolerates clock skew between nodes.
		NotBefore: now.Add(-5 * time.Minute),
		NotAfter:  now.Add(Validity),
	}, csr.PublicKey)
}
