// Package untrustedgrpc makes the message of a gRPC status a server sent safe to print
// (untrusted.Text). It is apart from package untrusted so that the verifier's packages, which
// use untrusted, do not depend on gRPC.
package untrustedgrpc

import (
	"google.golang.org/grpc/status"

	"github.com/openconstellation/constellation/pkg/untrusted"
)

// Status returns err, the error of a gRPC call, with the status's message made safe (Text):
// the message of a status a server returned is the server's text. The code is kept, so
// status.Code still tells what happened; details are dropped. An error that carries no gRPC
// status is not a server's (the caller's own checks of an answer) and is returned as it is.
func Status(err error) error {
	st, ok := status.FromError(err)
	if err == nil || !ok {
		return err
	}
	return status.Error(st.Code(), untrusted.Text(st.Message()))
}
