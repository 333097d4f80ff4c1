// Package netpipe joins two connections, as a TCP load balancer forwards a flow: the bytes of
// each side go to the other, and a side's end of writing is passed on, so a client that
// half-closes still reads the whole answer.
package netpipe

import (
	"io"
	"net"
)

// Join copies both ways until both directions have ended. A side that cannot half-close
// (no CloseWrite) is closed once its direction has ended, so the other direction ends too.
// It closes neither connection otherwise: the caller does.
func Join(a, b net.Conn) {
	done := make(chan struct{}, 2)
	half := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		} else {
			_ = dst.Close()
		}
		done <- struct{}{}
	}
	go half(a, b)
	go half(b, a)
	<-done
	<-done
}
