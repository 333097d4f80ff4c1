package volumeclient

import (
	"net/http"
	"time"
)

// Decoders of untrusted answers, for the fuzz target.
var (
	DecodeError  = decodeError
	DecodeVolume = decodeVolume
	DecodeSize   = decodeSize
	DecodePath   = decodePath
)

// SetHTTPClient replaces the client's HTTP client (a test's node calls from its own source
// address); SetBackoff its retry back-off.
func (c *Client) SetHTTPClient(hc *http.Client) { c.http = hc }

func (c *Client) SetBackoff(first, max time.Duration) { c.firstBackoff, c.maxBackoff = first, max }
