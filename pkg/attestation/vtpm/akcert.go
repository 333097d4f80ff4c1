package vtpm

import (
	"crypto"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"strings"
	"time"

	"github.com/openconstellation/constellation/pkg/attestation"
)

// What an AK certificate says about its node. The platform's AK CA (internal/attestation/akca)
// writes it, validators read it back, so both live here, next to the AK checks:
//
//	CN = the node's name; OU = "attestation key"; OU = "role:<control-plane|worker>"
//
// The role is in the certificate, not in the evidence, because only the platform knows it:
// a node's PCRs are the same whatever its role, and what a node says about itself is worth
// nothing to a peer deciding whether it may hand out cluster keys.
const (
	akCertOU       = "attestation key"
	akCertRoleUnit = "role:"
)

// AKCertSubject returns the subject of the AK certificate of node name in role.
func AKCertSubject(name string, role attestation.Role) (pkix.Name, error) {
	if name == "" {
		return pkix.Name{}, fmt.Errorf("AK certificate without a node name")
	}
	if !role.Valid() {
		return pkix.Name{}, fmt.Errorf("AK certificate for role %q, want %s or %s", role, attestation.RoleControlPlane, attestation.RoleWorker)
	}
	return pkix.Name{CommonName: name, OrganizationalUnit: []string{akCertOU, akCertRoleUnit + string(role)}}, nil
}

// AKCertTemplate returns the certificate a platform issues for the AK whose TPMT_PUBLIC
// encoding is akPublic, of node name in role, valid from a minute before now for validity,
// and the AK's public key to sign it for, after checking that the AK is a TPM-resident
// restricted signing key (CheckAKAttributes). The serial number is left to the CA.
func AKCertTemplate(akPublic []byte, name string, role attestation.Role, now time.Time, validity time.Duration) (*x509.Certificate, crypto.PublicKey, error) {
	subject, err := AKCertSubject(name, role)
	if err != nil {
		return nil, nil, err
	}
	pub, err := DecodeAKPublic(akPublic)
	if err != nil {
		return nil, nil, err
	}
	key, err := CheckAKAttributes(pub)
	if err != nil {
		return nil, nil, fmt.Errorf("refusing to certify: %w", err)
	}
	return &x509.Certificate{
		Subject:   subject,
		NotBefore: now.Add(-time.Minute),
		NotAfter:  now.Add(validity),
		KeyUsage:  x509.KeyUsageDigitalSignature,
	}, key, nil
}

// AKCertRole returns the role an AK certificate gives its node, or "" when it names no
// valid role or more than one (then the node has no role a peer may rely on).
func AKCertRole(cert *x509.Certificate) attestation.Role {
	var role attestation.Role
	for _, ou := range cert.Subject.OrganizationalUnit {
		r, ok := strings.CutPrefix(ou, akCertRoleUnit)
		if !ok {
			continue
		}
		if role != "" || !attestation.Role(r).Valid() {
			return ""
		}
		role = attestation.Role(r)
	}
	return role
}
