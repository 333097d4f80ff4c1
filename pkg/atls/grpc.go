package atls

import (
	"context"
	"net"
	"sync"

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

// RecordingCredentials are client credentials that remember the last failed attested
// handshake. gRPC reports a failed handshake as codes.Unavailable with the error flattened
// into the status message, and a call that waits for readiness as DeadlineExceeded naming at
// most the latest error: its message mixes this side's text with whatever a server may have
// said. A caller that reports why a call failed takes the *Error from LastError (its reason,
// its whole text, errors.Is reaching the attestation reason), and treats a status message as
// the server's text (untrusted.Status).
type RecordingCredentials struct {
	*Credentials

	mu   sync.Mutex
	last error
}

// Recording returns credentials that make the same handshakes as c and remember the last
// failed client handshake.
func (c *Credentials) Recording() *RecordingCredentials {
	return &RecordingCredentials{Credentials: c}
}

// ClientHandshake implements credentials.TransportCredentials.
func (c *RecordingCredentials) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.Credentials.ClientHandshake(ctx, authority, raw)
	if err != nil {
		c.mu.Lock()
		c.last = err
		c.mu.Unlock()
	}
	return conn, info, err
}

// Clone implements credentials.TransportCredentials: the clone records into the same place.
func (c *RecordingCredentials) Clone() credentials.TransportCredentials { return c }

// LastError returns the error of the last failed client handshake, nil if none failed.
func (c *RecordingCredentials) LastError() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

var _ credentials.TransportCredentials = (*RecordingCredentials)(nil)
