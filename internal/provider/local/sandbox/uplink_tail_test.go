package sandbox

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestTailWriterKeepsTheEnd(t *testing.T) {
	w := &tailWriter{max: 16}
	for range 1000 {
		_, _ = w.Write([]byte("do_slirp: read: bad state\n"))
	}
	_, _ = w.Write([]byte("last words"))
	assert.Len(t, w.String(), 16)
	assert.True(t, strings.HasSuffix(w.String(), "last words"))
}
