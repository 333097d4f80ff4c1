package untrustedgrpc_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/assert"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/openconstellation/constellation/pkg/untrusted/untrustedgrpc"
)

const hostile = "\x1b[2J\x1b]0;pwned\x07\r\nlevel=ERROR msg=forged"

func TestStatus(t *testing.T) {
	assert.NoError(t, untrustedgrpc.Status(nil))

	// A server's status: the code survives, the message is the server's text made safe.
	err := untrustedgrpc.Status(status.Error(codes.PermissionDenied, strings.Repeat(hostile, 10000)))
	assert.Equal(t, codes.PermissionDenied, status.Code(err))
	assertOneLine(t, err.Error())
	assert.LessOrEqual(t, len(err.Error()), 1024)
	assert.Contains(t, err.Error(), `\x1b[2J`)

	// Not a status at all: the caller's own error, returned as it is (errors.Is still works).
	own := errors.New("invalid join ticket")
	assert.Same(t, own, untrustedgrpc.Status(own))

	// A status wrapped by the caller: still one line.
	err = untrustedgrpc.Status(fmt.Errorf("calling: %w", status.Error(codes.Unavailable, "down\n")))
	assert.Equal(t, codes.Unavailable, status.Code(err))
	assertOneLine(t, err.Error())
}

// assertOneLine checks s has no control characters (so no second line or escape sequence).
func assertOneLine(t testing.TB, s string) {
	t.Helper()
	for _, r := range s {
		assert.False(t, unicode.IsControl(r), "control character %q in %q", r, s)
	}
}
