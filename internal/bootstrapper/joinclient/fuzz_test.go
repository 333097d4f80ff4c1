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

// validTicket is a ticket checkTicket accepts for self, with its serving and client keys.
func validTicket(f testing.TB) (*joinpb.IssueJoinTicketResponse, metadata.Instance, *ecdsa.PrivateKey, *ecdsa.PrivateKey) {
	self := metadata.Instance{Name: "node-1", Role: metadata.ControlPlane, IPs: []netip.Addr{netip.MustParseAddr("10.42.0.10")}}
	servingKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		f.Fatal(err)
	}
	clientKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		f.Fatal(err)
	}
	now := time.Now()
	ca, err := pki.NewCA("kubernetes", now, time.Hour)
	if err != nil {
		f.Fatal(err)
	}
	serving, err := ca.Issue(pki.Leaf{CommonName: "system:node:node-1", Organizations: []string{"system:nodes"}, Server: true, DNSNames: []string{"node-1"}, NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour)}, servingKey.Public())
	if err != nil {
		f.Fatal(err)
	}
	client, err := ca.Issue(pki.Leaf{CommonName: "system:node:node-1", Organizations: []string{"system:nodes"}, Client: true, NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour)}, clientKey.Public())
	if err != nil {
		f.Fatal(err)
	}
	good := &joinpb.IssueJoinTicketResponse{
		StateDiskKey: make([]byte, 32), MeasurementSecret: make([]byte, 32), MeasurementSalt: []byte("salt"),
		ApiServerEndpoint: "10.42.0.2:6443",
		KubeletCert:       pki.EncodeCert(serving), KubeletClientCert: pki.EncodeCert(client), ClusterCaCert: pki.EncodeCert(ca.Cert),
		ControlPlaneFiles: []*joinpb.ControlPlaneFile{{Name: pki.CAKey, Data: []byte("k")}},
	}
	return good, self, servingKey, clientKey
}

// FuzzCheckTicket feeds the ticket's field checks with arbitrary wire bytes. Property: no
// panic, and an accepted ticket writes only allowed files and has well-formed keys and
// endpoint. The certificate checks (checkTicketCerts) are crypto/x509 parsing and
// verification, fuzzed upstream and exercised by the join tests; under the fuzzer's
// coverage instrumentation they run at a few executions per second, so they are left out.
func FuzzCheckTicket(f *testing.F) {
	good, self, servingKey, clientKey := validTicket(f)
	if err := checkTicket(good, self, servingKey.Public(), clientKey.Public()); err != nil {
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
		if len(ticket.StateDiskKey) != 32 || len(ticket.MeasurementSecret) != 32 || !strings.Contains(ticket.ApiServerEndpoint, ":") {
			t.Fatal("accepted malformed keys or endpoint")
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
	leaf := func(cn string, client bool) pki.Leaf {
		return pki.Leaf{CommonName: cn, Client: client, Server: !client, NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour)}
	}
	for name, tc := range map[string]struct {
		mutate func(*joinpb.IssueJoinTicketResponse, *ecdsa.PrivateKey, *ecdsa.PrivateKey)
		worker bool
		want   string
	}{
		"short disk key": {mutate: func(r *joinpb.IssueJoinTicketResponse, _, _ *ecdsa.PrivateKey) { r.StateDiskKey = r.StateDiskKey[:16] }, want: "state disk key has 16 bytes"},
		"bad endpoint":   {mutate: func(r *joinpb.IssueJoinTicketResponse, _, _ *ecdsa.PrivateKey) { r.ApiServerEndpoint = "\x1b[2J" }, want: `API server endpoint "\x1b[2J" is not host:port`},
		"path traversal": {mutate: func(r *joinpb.IssueJoinTicketResponse, _, _ *ecdsa.PrivateKey) {
			r.ControlPlaneFiles[0].Name = "../../etc/shadow"
		}, want: `control-plane file "../../etc/shadow"`},
		"registry mirrors that are not a configuration": {mutate: func(r *joinpb.IssueJoinTicketResponse, _, _ *ecdsa.PrivateKey) {
			r.RegistryMirrors = []byte(`{"../../etc": ["https://m.example.com"]}`)
		}, want: `registry "../../etc": want a host name`},
		"worker with keys": {worker: true, mutate: func(*joinpb.IssueJoinTicketResponse, *ecdsa.PrivateKey, *ecdsa.PrivateKey) {}, want: "worker ticket carries control-plane files"},
		"certs from another CA": {mutate: func(r *joinpb.IssueJoinTicketResponse, _, _ *ecdsa.PrivateKey) {
			r.ClusterCaCert = pki.EncodeCert(otherCA.Cert)
		}, want: "kubelet client certificate: not signed by the cluster CA"},
		"serving cert for another key": {mutate: func(r *joinpb.IssueJoinTicketResponse, _, _ *ecdsa.PrivateKey) {
			c, err := otherCA.Issue(leaf("system:node:node-1", false), otherKey.Public())
			if err != nil {
				t.Fatal(err)
			}
			r.KubeletCert = pki.EncodeCert(c)
		}, want: "kubelet serving certificate: not signed by the cluster CA for this use: x509: certificate signed by unknown authority\nnot for this node's key"},
		"client cert for another node": {mutate: func(r *joinpb.IssueJoinTicketResponse, _, clientKey *ecdsa.PrivateKey) {
			c, err := otherCA.Issue(leaf("system:node:control-plane-0", true), clientKey.Public())
			if err != nil {
				t.Fatal(err)
			}
			r.KubeletClientCert = pki.EncodeCert(c)
		}, want: `for "system:node:control-plane-0", not system:node:node-1`},
		"client cert that serves": {mutate: func(r *joinpb.IssueJoinTicketResponse, _, _ *ecdsa.PrivateKey) {
			r.KubeletClientCert = r.KubeletCert
		}, want: "kubelet client certificate: not signed by the cluster CA for this use"},
	} {
		t.Run(name, func(t *testing.T) {
			ticket, self, servingKey, clientKey := validTicket(t)
			if tc.worker {
				self.Role = metadata.Worker
			}
			tc.mutate(ticket, servingKey, clientKey)
			err := checkTicket(ticket, self, servingKey.Public(), clientKey.Public())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
