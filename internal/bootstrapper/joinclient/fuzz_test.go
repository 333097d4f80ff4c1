package joinclient

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"net/netip"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/openconstellation/constellation/api/join/joinpb"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/pki"
)

// FuzzCheckTicket feeds the ticket checks with arbitrary wire bytes. Property: no panic,
// and an accepted ticket writes only allowed files and carries a kubelet certificate for
// this node's key and name, signed by its own CA.
func FuzzCheckTicket(f *testing.F) {
	self := metadata.Instance{Name: "node-1", Role: metadata.ControlPlane, IPs: []netip.Addr{netip.MustParseAddr("10.42.0.10")}}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		f.Fatal(err)
	}
	now := time.Now()
	ca, err := pki.NewCA("kubernetes", now, time.Hour)
	if err != nil {
		f.Fatal(err)
	}
	cert, err := ca.Issue(pki.Leaf{CommonName: "system:node:node-1", Organizations: []string{"system:nodes"}, Server: true, DNSNames: []string{"node-1"}, NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour)}, key.Public())
	if err != nil {
		f.Fatal(err)
	}
	good := &joinpb.IssueJoinTicketResponse{
		StateDiskKey: make([]byte, 32), MeasurementSecret: make([]byte, 32), MeasurementSalt: []byte("salt"),
		ApiServerEndpoint: "10.42.0.2:6443", Token: "abcdef.0123456789abcdef",
		DiscoveryTokenCaCertHash: pki.DiscoveryHash(ca.Cert),
		KubeletCert:              pki.EncodeCert(cert), ClusterCaCert: pki.EncodeCert(ca.Cert),
		ControlPlaneFiles: []*joinpb.ControlPlaneFile{{Name: pki.CAKey, Data: []byte("k")}},
	}
	if err := checkTicket(good, self, key.Public()); err != nil {
		f.Fatalf("seed ticket refused: %v", err)
	}
	seed, err := proto.Marshal(good)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	traversal := proto.Clone(good).(*joinpb.IssueJoinTicketResponse)
	traversal.ControlPlaneFiles = []*joinpb.ControlPlaneFile{{Name: "../../etc/passwd"}}
	if seed, err = proto.Marshal(traversal); err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Fuzz(func(t *testing.T, data []byte) {
		var ticket joinpb.IssueJoinTicketResponse
		if proto.Unmarshal(data, &ticket) != nil {
			return
		}
		if checkTicket(&ticket, self, key.Public()) != nil {
			return
		}
		for _, file := range ticket.ControlPlaneFiles {
			if !slices.Contains(pki.ControlPlaneFiles, file.Name) {
				t.Fatalf("accepted file %q", file.Name)
			}
		}
		c, err := pki.ParseCert(ticket.KubeletCert)
		if err != nil {
			t.Fatalf("accepted unparsable kubelet certificate: %v", err)
		}
		if !c.PublicKey.(*ecdsa.PublicKey).Equal(key.Public()) || c.Subject.CommonName != "system:node:node-1" {
			t.Fatal("accepted a kubelet certificate for another key or name")
		}
		caCert, err := pki.ParseCert(ticket.ClusterCaCert)
		if err != nil {
			t.Fatalf("accepted unparsable CA: %v", err)
		}
		pool := x509.NewCertPool()
		pool.AddCert(caCert)
		if _, err := c.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
			t.Fatalf("accepted a kubelet certificate the CA did not sign: %v", err)
		}
	})
}
