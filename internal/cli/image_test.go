package cli

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/provider"
)

// TestReportImageLoads: every node's outcome is printed; a node that failed fails the command,
// named, with what happens to it next.
func TestReportImageLoads(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, reportImageLoads(&out, []provider.ImageLoad{{Node: "control-plane-0"}, {Node: "worker-0", Deferred: true}}, 2))
	assert.Equal(t, "OK    control-plane-0: 2 image(s) imported\nlater worker-0: off; imports the images when it boots\n", out.String())

	out.Reset()
	err := reportImageLoads(&out, []provider.ImageLoad{{Node: "control-plane-0"}, {Node: "worker-1", Error: "ctr: unexpected EOF"}}, 1)
	require.Error(t, err)
	assert.Contains(t, out.String(), "FAIL  worker-1: ctr: unexpected EOF")
	assert.Contains(t, err.Error(), "1 of 2 nodes did not import the images (worker-1)")
	assert.Contains(t, err.Error(), "next boot")
}
