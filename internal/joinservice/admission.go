package joinservice

import (
	"errors"
	"net"

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
