package joinclient

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/openconstellation/constellation/api/join/joinpb"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/pki"
)

// FuzzCheckTicket feeds the ticket's field checks with arbitrary wire bytes. Property: no
// panic, and an accepted ticket writes only allowed files and has well-formed keys, token
// and hash. The certificate checks (checkTicketCerts) are crypto/x509 parsing and
// verification, fuzzed upstream and exercised by the join tests; under the fuzzer's
// coverage instrumentation they run at a few executions per second, so they are left out.
func validTicket(f testing.TB) (*joinpb.IssueJoinTicketResponse, metadata.Instance, *ecdsa.PrivateKey) {
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
	return good, self, key
}

func FuzzCheckTicket(f *testing.F) {
	good, self, key := validTicket(f)
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
		if checkTicketFields(&ticket, self) != nil {
			return
		}
		for _, file := range ticket.ControlPlaneFiles {
			if !slices.Contains(pki.ControlPlaneFiles, file.Name) {
				t.Fatalf("accepted file %q", file.Name)
			}
		}
		if len(ticket.StateDiskKey) != 32 || len(ticket.MeasurementSecret) != 32 || len(ticket.Token) != 23 || len(ticket.DiscoveryTokenCaCertHash) != 71 {
			t.Fatal("accepted malformed keys, token or hash")
		}
	})
}

func TestCheckTicketRefusals(t *testing.T) {
	otherCA, err := pki.NewCA("other", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	otherKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		mutate func(*joinpb.IssueJoinTicketResponse, metadata.Instance)
		worker bool
		want   string
	}{
		"short disk key": {mutate: func(r *joinpb.IssueJoinTicketResponse, _ metadata.Instance) { r.StateDiskKey = r.StateDiskKey[:16] }, want: "state disk key has 16 bytes"},
		"bad token":      {mutate: func(r *joinpb.IssueJoinTicketResponse, _ metadata.Instance) { r.Token = "abc" }, want: "bootstrap token is not of the form"},
		"path traversal": {mutate: func(r *joinpb.IssueJoinTicketResponse, _ metadata.Instance) {
			r.ControlPlaneFiles[0].Name = "../../etc/shadow"
		}, want: `control-plane file "../../etc/shadow"`},
		"worker with keys": {worker: true, mutate: func(*joinpb.IssueJoinTicketResponse, metadata.Instance) {}, want: "worker ticket carries control-plane files"},
		"hash of another CA": {mutate: func(r *joinpb.IssueJoinTicketResponse, _ metadata.Instance) {
			r.DiscoveryTokenCaCertHash = pki.DiscoveryHash(otherCA.Cert)
		}, want: "does not match the cluster CA"},
		"cert from another CA": {mutate: func(r *joinpb.IssueJoinTicketResponse, _ metadata.Instance) {
			r.ClusterCaCert = pki.EncodeCert(otherCA.Cert)
			r.DiscoveryTokenCaCertHash = pki.DiscoveryHash(otherCA.Cert)
		}, want: "not signed by the cluster CA"},
		"cert for another key": {mutate: func(r *joinpb.IssueJoinTicketResponse, _ metadata.Instance) {
			c, err := otherCA.Issue(pki.Leaf{CommonName: "system:node:node-1", Server: true, NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour)}, otherKey.Public())
			if err != nil {
				t.Fatal(err)
			}
			r.KubeletCert = pki.EncodeCert(c)
		}, want: "not for this node's key"},
	} {
		t.Run(name, func(t *testing.T) {
			ticket, self, key := validTicket(t)
			if tc.worker {
				self.Role = metadata.Worker
			}
			tc.mutate(ticket, self)
			err := checkTicket(ticket, self, key.Public())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
