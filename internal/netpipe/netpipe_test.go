package netpipe

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestJoinPassesHalfClose: a client that ends its writing still reads the server's whole
// answer, written after the client's end arrived.
func TestJoinPassesHalfClose(t *testing.T) {
	server, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { server.Close() })
	go func() {
		conn, err := server.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		asked, _ := io.ReadAll(conn) // until the client's end of writing
		_, _ = conn.Write(append([]byte("answer to "), asked...))
	}()
	front, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { front.Close() })
	joined := make(chan struct{})
	go func() {
		defer close(joined)
		in, err := front.Accept()
		if err != nil {
			return
		}
		defer in.Close()
		up, err := net.Dial("tcp", server.Addr().String())
		if err != nil {
			return
		}
		defer up.Close()
		Join(in, up)
	}()

	client, err := net.Dial("tcp", front.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { client.Close() })
	require.NoError(t, client.SetDeadline(time.Now().Add(10*time.Second)))
	_, err = client.Write([]byte("question"))
	require.NoError(t, err)
	require.NoError(t, client.(*net.TCPConn).CloseWrite())
	answer, err := io.ReadAll(client)
	require.NoError(t, err)
	assert.Equal(t, "answer to question", string(answer))
	select {
	case <-joined:
	case <-time.After(10 * time.Second):
		t.Fatal("Join did not return once both directions ended")
	}
}

// TestJoinEndsWithoutHalfClose: a side that cannot half-close is closed when its direction
// ends, so Join returns.
func TestJoinEndsWithoutHalfClose(t *testing.T) {
	a, peerA := net.Pipe()
	b, peerB := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close(); peerA.Close(); peerB.Close() })
	joined := make(chan struct{})
	go func() { Join(a, b); close(joined) }()
	go func() { _, _ = io.Copy(io.Discard, peerB) }()
	go func() { _, _ = peerA.Write([]byte("x")); peerA.Close() }()
	select {
	case <-joined:
	case <-time.After(10 * time.Second):
		t.Fatal("Join did not return")
	}
}
