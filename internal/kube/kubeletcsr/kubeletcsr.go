// Package kubeletcsr checks a node's certificate requests for its kubelet and signs them: the
// one place where Constellation vouches for a node's Kubernetes name.
//
// A kubelet has two certificates, each for one purpose, each with its own key:
//
//   - the client certificate (ClientAuth only, CN system:node:<name>, O system:nodes, no SANs)
//     it authenticates to the API server with. Constellation issues it only at an attested
//     entry into the cluster (the init node's own, a join or rejoin ticket, a recovered
//     control plane's own) and for ClientValidity; from then on the kubelet renews it itself
//     through kube-controller-manager, which approves only a request for the requester's own
//     name (kubeadm's "selfnodeclient" rule) and signs it for the same ClientValidity. Nothing
//     a node holds can get another name approved (docs/threat-model.md, A4).
//   - the serving certificate (ServerAuth only, the node's name and addresses as SANs), which
//     the API server checks when it connects to the kubelet (logs, exec, port-forward).
//
// A request is untrusted input even from an attested node: the image is trusted, but the name
// and addresses it asks for must be the ones the platform attributes to that node, or one node
// could impersonate another to the API server (the Node authorizer trusts the certificate's
// name). Steps, in order: parse, verify the request's self-signature, validate it against
// the node's identity. Only then is a certificate issued.
package kubeletcsr

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/openconstellation/constellation/internal/pki"
	"github.com/openconstellation/constellation/internal/untrusted"
)

// Kubernetes names of node identities.
const (
	NodeUserPrefix = "system:node:"
	NodesGroup     = "system:nodes"
)

// MaxRequestSize caps a DER request before parsing; a kubelet request is well under 1 KiB.
const MaxRequestSize = 16 << 10

// Validity of the certificates this package issues.
const (
	// ServingValidity: serving certificates, as kubeadm's leaf certificates. A serving
	// certificate authenticates nobody to the API server.
	ServingValidity = 365 * 24 * time.Hour
	// ClientValidity: client certificates, Constellation's and the ones kube-controller-manager
	// signs when a kubelet renews its own (kubeadmconfig sets --cluster-signing-duration to
	// it). A kubelet renews at 70-90 % of it; a removed node cannot renew (its requests are
	// refused), so a credential it kept dies within ClientValidity even where nothing else
	// refuses it.
	ClientValidity = 24 * time.Hour
	// backdate tolerates clock skew between nodes.
	backdate = 5 * time.Minute
)

// ErrRejected is wrapped by every error about the request's content.
var ErrRejected = errors.New("kubelet certificate request rejected")

// Node is what the platform says about the node asking.
type Node struct {
	Name      string
	Addresses []netip.Addr
}

// CheckServing parses and verifies der and validates it as node's serving certificate
// request: subject exactly CN system:node:<name> and O system:nodes; DNS SANs only the
// node's name; IP SANs only the node's addresses; no other SANs; an ECDSA P-256/P-384 or
// RSA ≥ 2048 key.
func CheckServing(der []byte, node Node) (*x509.CertificateRequest, error) {
	return check(der, node, true)
}

// CheckClient parses and verifies der and validates it as the client certificate request of
// the node named name: subject exactly CN system:node:<name> and O system:nodes, no SANs at
// all (kube-controller-manager refuses SANs in kubelet client requests too), a key as
// CheckServing's.
func CheckClient(der []byte, name string) (*x509.CertificateRequest, error) {
	return check(der, Node{Name: name}, false)
}

func check(der []byte, node Node, serving bool) (*x509.CertificateRequest, error) {
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
	if !serving {
		if n := len(csr.DNSNames) + len(csr.IPAddresses) + len(csr.EmailAddresses) + len(csr.URIs); n > 0 {
			problems = append(problems, fmt.Errorf("%d SANs in a client certificate request, want none", n))
		}
	}
	var badNames, badIPs []string
	for _, name := range csr.DNSNames {
		if name != node.Name {
			badNames = append(badNames, untrusted.Quote(name))
		}
	}
	if len(badNames) > 0 && serving {
		problems = append(problems, fmt.Errorf("DNS name %s is not the node's name %q", listed(badNames), node.Name))
	}
	for _, ip := range csr.IPAddresses {
		addr, ok := netip.AddrFromSlice(ip)
		if !ok || !slices.Contains(node.Addresses, addr.Unmap()) {
			badIPs = append(badIPs, ip.String())
		}
	}
	if len(badIPs) > 0 && serving {
		problems = append(problems, fmt.Errorf("IP address %s is not one of the node's addresses %v", listed(badIPs), node.Addresses))
	}
	if len(csr.EmailAddresses)+len(csr.URIs) > 0 && serving {
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

// IssueServing issues the kubelet's serving certificate from ca for a request that passed
// CheckServing, valid ServingValidity from now (backdated a little for clock skew).
func IssueServing(ca *pki.CA, csr *x509.CertificateRequest, now time.Time) (*x509.Certificate, error) {
	ips := make([]net.IP, len(csr.IPAddresses))
	copy(ips, csr.IPAddresses)
	return ca.Issue(pki.Leaf{
		CommonName: csr.Subject.CommonName, Organizations: []string{NodesGroup},
		DNSNames: csr.DNSNames, IPs: ips, Server: true,
		NotBefore: now.Add(-backdate), NotAfter: now.Add(ServingValidity),
	}, csr.PublicKey)
}

// IssueClient issues the kubelet's client certificate from ca for a request that passed
// CheckClient, valid ClientValidity from now.
func IssueClient(ca *pki.CA, csr *x509.CertificateRequest, now time.Time) (*x509.Certificate, error) {
	return ca.Issue(pki.Leaf{
		CommonName: csr.Subject.CommonName, Organizations: []string{NodesGroup}, Client: true,
		NotBefore: now.Add(-backdate), NotAfter: now.Add(ClientValidity),
	}, csr.PublicKey)
}

// ServingRequest returns a serving certificate request for the node (its name and addresses)
// signed by key: what CheckServing accepts.
func ServingRequest(node Node, key crypto.Signer) ([]byte, error) {
	tmpl := &x509.CertificateRequest{
		Subject:  pkix.Name{CommonName: NodeUserPrefix + node.Name, Organization: []string{NodesGroup}},
		DNSNames: []string{node.Name},
	}
	for _, ip := range node.Addresses {
		tmpl.IPAddresses = append(tmpl.IPAddresses, ip.AsSlice())
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		return nil, fmt.Errorf("kubelet serving certificate request: %w", err)
	}
	return der, nil
}

// ClientRequest returns a client certificate request for the node named name signed by key:
// what CheckClient accepts.
func ClientRequest(name string, key crypto.Signer) ([]byte, error) {
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: NodeUserPrefix + name, Organization: []string{NodesGroup}},
	}, key)
	if err != nil {
		return nil, fmt.Errorf("kubelet client certificate request: %w", err)
	}
	return der, nil
}
