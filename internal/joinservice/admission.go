package joinservice

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"google.golang.org/grpc/credentials"

	"github.com/openconstellation/constellation/internal/handshakelimit"
	"github.com/openconstellation/constellation/pkg/atls"
)

// observedCredentials logs and counts every handshake the join service refuses: a refused
// handshake is an admission decision, and gRPC would otherwise drop it silently.
type observedCredentials struct {
	*atls.Credentials
	svc *Service
}

func (o observedCredentials) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	start := o.svc.cfg.Now()
	conn, info, err := o.Credentials.ServerHandshake(raw)
	if err != nil {
		reason := "protocol"
		var e *atls.Error
		if errors.As(err, &e) {
			reason = e.Reason
			if r := handshakelimit.Reason(err); reason == "refused" && r != "" {
				reason = r // rate-limited, peer-busy or busy
			}
		}
		o.svc.reject("handshake", handshakelimit.AddrOf(raw.RemoteAddr()), "", reason, err, start)
		return nil, nil, err
	}
	return conn, info, nil
}

func (o observedCredentials) Clone() credentials.TransportCredentials { return o }

// observeAccept logs and counts what the accept-time bound did (stage "accept"): a refused
// connection never reaches the handshake, and one closed at its deadline or displaced would
// otherwise only show up as a failed TLS read.
func (s *Service) observeAccept(remote netip.Addr, outcome string) {
	limits := s.acceptLimiter.Limits()
	now := s.cfg.Now()
	start := now
	var err error
	switch outcome {
	case handshakelimit.AcceptPeerBusy:
		err = fmt.Errorf("connection refused: this address already has %d connections whose handshake has not finished", limits.PerPeer)
	case handshakelimit.AcceptBusy:
		err = fmt.Errorf("connection refused: %d connections whose handshake has not finished, none from an address with more than this one", limits.Total)
	case handshakelimit.AcceptDisplaced:
		err = fmt.Errorf("connection closed before its handshake finished, for a peer with fewer pending connections (%d pending in all)", limits.Total)
	case handshakelimit.AcceptTimeout:
		err = fmt.Errorf("connection closed: handshake not finished within %v", limits.Timeout)
		start = now.Add(-limits.Timeout)
	default:
		err = errors.New(outcome)
	}
	s.reject("accept", remote, "", outcome, err, start)
}
