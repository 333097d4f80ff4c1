package bootstraptest

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"
	"google.golang.org/grpc"

	"github.com/openconstellation/constellation/api/init/initpb"
	"github.com/openconstellation/constellation/pkg/atls"
	"github.com/openconstellation/constellation/pkg/attestation"
)

// InitSecret is the init secret test CLIs use; InitSecretHash its bcrypt hash for metadata.
const InitSecret = "correct horse battery staple"

// InitSecretHash is the bcrypt hash of InitSecret (minimum cost, for speed).
var InitSecretHash = func() []byte {
	h, err := bcrypt.GenerateFromPassword([]byte(InitSecret), bcrypt.MinCost)
	if err != nil {
		panic(err)
	}
	return h
}()

// InitResult is what a CLI's Init call received.
type InitResult struct {
	Progress []string
	Log      []byte
	Success  *initpb.InitSuccess
	Err      error
}

// CallInit is the CLI side of init: it verifies the node at addr with v, sends req and
// collects the stream.
func CallInit(t testing.TB, addr string, v attestation.Validator, req *initpb.InitRequest) InitResult {
	return CallInitFrom(t, "", addr, v, req)
}

// CallInitFrom is CallInit from the source address local (e.g. "127.0.0.7"; "": any), so
// that tests can be different callers to the init server's per-caller limits.
func CallInitFrom(t testing.TB, local, addr string, v attestation.Validator, req *initpb.InitRequest) InitResult {
	creds, err := atls.NewCredentials(atls.Config{Validators: []attestation.Validator{v}})
	require.NoError(t, err)
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if local != "" {
		opts = append(opts, grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
			return d.DialContext(ctx, "tcp", addr)
		}))
	}
	conn, err := grpc.NewClient("passthrough:///"+addr, opts...)
	require.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var res InitResult
	stream, err := initpb.NewInitServiceClient(conn).Init(ctx, req)
	if err != nil {
		res.Err = err
		return res
	}
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return res
		}
		if err != nil {
			res.Err = err
			return res
		}
		switch k := msg.Kind.(type) {
		case *initpb.InitResponse_Progress:
			res.Progress = append(res.Progress, k.Progress.Message)
		case *initpb.InitResponse_Log:
			res.Log = append(res.Log, k.Log.Data...)
		case *initpb.InitResponse_Success:
			res.Success = k.Success
		}
	}
}
