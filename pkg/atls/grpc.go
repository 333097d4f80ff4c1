package atls

import (
	"context"
	"net"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/openconstellation/constellation/pkg/attestation"
)

// AuthInfo is what gRPC handlers see of an attested peer (peer.FromContext).
type AuthInfo struct {
	credentials.CommonAuthInfo
	// Peer is the verified evidence of the peer, nil if this side did not require it.
	Peer *attestation.Verified
}

// AuthType implements credentials.AuthInfo.
func (AuthInfo) AuthType() string { return "atls" }

// PeerFromContext returns the verified evidence of the caller of a gRPC handler.
func PeerFromContext(ctx context.Context) (*attestation.Verified, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil, false
	}
	info, ok := p.AuthInfo.(AuthInfo)
	if !ok || info.Peer == nil {
		return nil, false
	}
	return info.Peer, true
}

// ClientHandshake implements credentials.TransportCredentials.
func (c *Credentials) ClientHandshake(ctx context.Context, _ string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, err := c.Client(ctx, raw)
	if err != nil {
		return nil, nil, err
	}
	return conn, authInfo(conn), nil
}

// ServerHandshake implements credentials.TransportCredentials. gRPC gives no context here; the
// handshake is bounded by HandshakeTimeout, and its deadline stays on the connection until
// gRPC has read the HTTP/2 preface (gRPC then clears it).
func (c *Credentials) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, err := c.serverKeepingDeadline(context.Background(), raw)
	if err != nil {
		return nil, nil, err
	}
	return conn, authInfo(conn), nil
}

func authInfo(conn *Conn) AuthInfo {
	return AuthInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}, Peer: conn.Peer()}
}

// Info implements credentials.TransportCredentials.
func (c *Credentials) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "atls"}
}

// Clone implements credentials.TransportCredentials. Credentials are immutable.
func (c *Credentials) Clone() credentials.TransportCredentials { return c }

// OverrideServerName implements credentials.TransportCredentials; the server name plays no
// role in aTLS.
func (c *Credentials) OverrideServerName(string) error { return nil }

var _ credentials.TransportCredentials = (*Credentials)(nil)
