package initserver_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/openconstellation/constellation/api/join/joinpb"
	"github.com/openconstellation/constellation/internal/bootstrapper/bootstraptest"
	"github.com/openconstellation/constellation/internal/kube/kubeletcsr"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/pkg/atls"
)

// The init node never asks for a join ticket, so init records its disk: after init, the
// join service gives control-plane-0 a rejoin ticket for its own disk, and another attested
// control-plane node none, for either ticket.
func TestInitNodeDiskRejoinedOnlyByItself(t *testing.T) {
	e := newEnv(t)
	req, _ := request(t)
	res := e.call(req)
	require.NoError(t, res.Err)
	diskUUID, err := e.node.Storage.UUID()
	require.NoError(t, err)

	cluster := bootstraptest.StartJoinService(t, e.ca, kube, bootstraptest.ClusterOptions{})
	cluster.Admit("control-plane-0", netip.MustParseAddr("10.42.0.2"), true)
	cluster.Admit("control-plane-1", netip.MustParseAddr("10.42.0.3"), true)
	other := bootstraptest.NewNode(t, "control-plane-1", metadata.ControlPlane, e.ca)

	dial := func(t *testing.T, n *bootstraptest.Node) joinpb.JoinServiceClient {
		// The service's side of the decision is under test: the callers need not check it.
		creds, err := atls.NewCredentials(atls.Config{Issuer: n.Issuer(t)})
		require.NoError(t, err)
		conn, err := grpc.NewClient("passthrough:///"+cluster.Addr, grpc.WithTransportCredentials(creds),
			grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
			}))
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close() })
		return joinpb.NewJoinServiceClient(conn)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	clientCSR := func(name string) []byte {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		der, err := kubeletcsr.ClientRequest(name, key)
		require.NoError(t, err)
		return der
	}
	resp, err := dial(t, e.node).IssueRejoinTicket(ctx, &joinpb.IssueRejoinTicketRequest{DiskUuid: diskUUID, ClientCertificateRequest: clientCSR("control-plane-0")})
	require.NoError(t, err)
	want, err := cluster.Master.StateDiskKey(diskUUID)
	require.NoError(t, err)
	assert.Equal(t, want, resp.StateDiskKey)

	attacker := dial(t, other)
	rejoin, err := attacker.IssueRejoinTicket(ctx, &joinpb.IssueRejoinTicketRequest{DiskUuid: diskUUID, ClientCertificateRequest: clientCSR("control-plane-1")})
	assert.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	assert.ErrorContains(t, err, "belongs to another node")
	assert.Nil(t, rejoin)
	// A join ticket with a valid request for itself: refused for the disk alone.
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject:     pkix.Name{CommonName: "system:node:control-plane-1", Organization: []string{"system:nodes"}},
		IPAddresses: []net.IP{net.ParseIP("10.42.0.3")},
	}, key)
	require.NoError(t, err)
	join, err := attacker.IssueJoinTicket(ctx, &joinpb.IssueJoinTicketRequest{DiskUuid: diskUUID, CertificateRequest: csr, ClientCertificateRequest: clientCSR("control-plane-1"), IsControlPlane: true})
	assert.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	assert.ErrorContains(t, err, "belongs to another node")
	assert.Nil(t, join)
}
