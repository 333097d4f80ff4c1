// Package volumeclient is the CSI driver's side of the local provider's volume API
// (docs/local-provider.md "Metadata service"): csidriver.Backing for the controller half on a
// control plane, csidriver.Devices for the node half on any node. The provider identifies the
// caller by its source address, so the same client is a control plane's or a node's by where
// it runs.
//
// Every answer is size-limited, decoded strictly and checked (the volume's id is the one asked
// for, sizes in range, node names, a device path that is absolute, clean and the volume's own
// file) before it is returned. Refusals come back as the csidriver errors the server's reason
// names. Transient failures (connection refused or reset, 5xx, 429) are retried with back-off
// until the call's deadline; definitive ones (4xx) are returned at once.
package volumeclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"syscall"
	"time"

	"github.com/openconstellation/constellation/internal/csidriver"
	"github.com/openconstellation/constellation/internal/provider/local/metaserver"
	"github.com/openconstellation/constellation/internal/provider/local/volumestore"
	"github.com/openconstellation/constellation/pkg/strictjson"
	"github.com/openconstellation/constellation/pkg/untrusted"
)

// DefaultDeadline bounds a call (its retries included) whose context has no deadline.
const DefaultDeadline = 30 * time.Second

// requestTimeout bounds one request.
const requestTimeout = 10 * time.Second

// maxAnswer bounds an answer: a volume record or an error of a few hundred bytes.
const maxAnswer = 16 << 10

// Client calls the volume API of the metadata service.
type Client struct {
	base *url.URL
	// err is why the URL given to New is unusable; every call returns it.
	err  error
	http *http.Client
	// firstBackoff doubles after each transient failure up to maxBackoff.
	firstBackoff, maxBackoff time.Duration
}

var (
	_ csidriver.Backing = (*Client)(nil)
	_ csidriver.Devices = (*Client)(nil)
)

// New returns a client of the metadata service at metadataURL (http or https, no path beyond
// "/"; metadataclient.DefaultURL in the cluster). A URL that is not of that form makes every
// call fail, naming it.
func New(metadataURL string) *Client {
	c := &Client{
		http: &http.Client{
			Timeout: requestTimeout,
			Transport: &http.Transport{
				DialContext:           (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
				ResponseHeaderTimeout: requestTimeout,
				MaxIdleConnsPerHost:   2,
				IdleConnTimeout:       30 * time.Second,
			},
			CheckRedirect: func(*http.Request, []*http.Request) error {
				return errors.New("the metadata service does not redirect")
			},
		},
		firstBackoff: 100 * time.Millisecond,
		maxBackoff:   2 * time.Second,
	}
	u, err := url.Parse(metadataURL)
	switch {
	case err != nil:
		c.err = fmt.Errorf("metadata service URL %q: %w", metadataURL, err)
	case (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil:
		c.err = fmt.Errorf("metadata service URL %q: want http(s)://host[:port]", metadataURL)
	default:
		c.base = u
	}
	return c
}

// Create implements csidriver.Backing.
func (c *Client) Create(ctx context.Context, id string, size int64) (csidriver.Volume, error) {
	if err := checkRequest(id, size); err != nil {
		return csidriver.Volume{}, err
	}
	body, _ := json.Marshal(metaserver.VolumeSize{Bytes: size})
	ans, err := c.do(ctx, http.MethodPut, id, metaserver.PathVolumes+id, body, http.StatusOK)
	if err != nil {
		return csidriver.Volume{}, err
	}
	v, err := decodeVolume(ans, id)
	if err != nil {
		return csidriver.Volume{}, fmt.Errorf("creating volume %s: %w", id, err)
	}
	if v.Bytes != size {
		return csidriver.Volume{}, fmt.Errorf("creating volume %s of %d bytes: the provider answered %d bytes", id, size, v.Bytes)
	}
	return v, nil
}

// Get implements csidriver.Backing.
func (c *Client) Get(ctx context.Context, id string) (csidriver.Volume, error) {
	if err := checkID(id); err != nil {
		return csidriver.Volume{}, err
	}
	ans, err := c.do(ctx, http.MethodGet, id, metaserver.PathVolumes+id, nil, http.StatusOK)
	if err != nil {
		return csidriver.Volume{}, err
	}
	v, err := decodeVolume(ans, id)
	if err != nil {
		return csidriver.Volume{}, fmt.Errorf("volume %s: %w", id, err)
	}
	return v, nil
}

// Delete implements csidriver.Backing.
func (c *Client) Delete(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	_, err := c.do(ctx, http.MethodDelete, id, metaserver.PathVolumes+id, nil, http.StatusNoContent)
	return err
}

// Attach implements csidriver.Backing.
func (c *Client) Attach(ctx context.Context, id, node string) error {
	if err := checkID(id); err != nil {
		return err
	}
	if err := volumestore.CheckNode(node); err != nil {
		return err
	}
	body, _ := json.Marshal(metaserver.Attachment{Node: node})
	_, err := c.do(ctx, http.MethodPut, id, metaserver.PathVolumes+id+"/attachment", body, http.StatusNoContent)
	return err
}

// Detach implements csidriver.Backing.
func (c *Client) Detach(ctx context.Context, id, node string) error {
	if err := checkID(id); err != nil {
		return err
	}
	if err := volumestore.CheckNode(node); err != nil {
		return err
	}
	_, err := c.do(ctx, http.MethodDelete, id, metaserver.PathVolumes+id+"/attachment/"+node, nil, http.StatusNoContent)
	return err
}

// Expand implements csidriver.Backing.
func (c *Client) Expand(ctx context.Context, id string, size int64) (int64, error) {
	if err := checkRequest(id, size); err != nil {
		return 0, err
	}
	body, _ := json.Marshal(metaserver.VolumeSize{Bytes: size})
	ans, err := c.do(ctx, http.MethodPost, id, metaserver.PathVolumes+id+"/expand", body, http.StatusOK)
	if err != nil {
		return 0, err
	}
	n, err := decodeSize(ans)
	if err != nil {
		return 0, fmt.Errorf("expanding volume %s: %w", id, err)
	}
	if n < size {
		return 0, fmt.Errorf("expanding volume %s to %d bytes: the provider answered %d bytes", id, size, n)
	}
	return n, nil
}

// Device implements csidriver.Devices: the backing file of a volume attached to this node.
func (c *Client) Device(ctx context.Context, id string) (string, error) {
	if err := checkID(id); err != nil {
		return "", err
	}
	ans, err := c.do(ctx, http.MethodGet, id, metaserver.PathSelfVolumes+id, nil, http.StatusOK)
	if err != nil {
		return "", err
	}
	p, err := decodePath(ans, id)
	if err != nil {
		return "", fmt.Errorf("device of volume %s: %w", id, err)
	}
	return p, nil
}

// do makes the request, retrying transient failures with back-off until ctx's deadline (or
// DefaultDeadline), and returns the answer's body if its status is want. Any other status is
// the error the answer names.
func (c *Client) do(ctx context.Context, method, id, path string, body []byte, want int) ([]byte, error) {
	if c.err != nil {
		return nil, c.err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultDeadline)
		defer cancel()
	}
	what := method + " " + path
	backoff := c.firstBackoff
	// last is the latest transient failure: when the deadline ends the retries (while
	// waiting, or in the middle of a request), it is what the caller needs to know.
	var last error
	gaveUp := func(attempts int) error {
		return fmt.Errorf("volume API %s: gave up after %d attempts: %w (last: %w)", what, attempts, ctx.Err(), last)
	}
	for attempt := 1; ; attempt++ {
		status, ans, err := c.once(ctx, method, path, body)
		switch {
		case err == nil && status == want:
			return ans, nil
		case err == nil:
			err = answerError(id, status, ans)
			if !transientStatus(status) {
				return nil, fmt.Errorf("volume API %s: %w", what, err)
			}
		case ctx.Err() != nil && last != nil:
			return nil, gaveUp(attempt - 1)
		case ctx.Err() != nil || !transientError(err):
			return nil, fmt.Errorf("volume API %s: %w", what, err)
		}
		last = err
		select {
		case <-ctx.Done():
			return nil, gaveUp(attempt)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, c.maxBackoff)
	}
}

// once makes one request and returns its status and body (at most maxAnswer bytes).
func (c *Client) once(ctx context.Context, method, path string, body []byte) (int, []byte, error) {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base.JoinPath(path).String(), r)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	ans, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer+1))
	if err != nil {
		return 0, nil, fmt.Errorf("reading the answer: %w", err)
	}
	if len(ans) > maxAnswer {
		return 0, nil, fmt.Errorf("answer larger than %d bytes", maxAnswer)
	}
	return resp.StatusCode, ans, nil
}

// transientStatus: the provider is restarting or busy; the same request may succeed later.
func transientStatus(status int) bool {
	switch status {
	case http.StatusTooManyRequests, http.StatusInternalServerError, http.StatusBadGateway,
		http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// transientError: the provider is not listening yet or went away mid-request (a restart).
func transientError(err error) bool {
	var ne net.Error
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		(errors.As(err, &ne) && ne.Timeout())
}

// answerError is the error an answer of status names: the csidriver error of the server's
// reason when status and reason agree, else the status and the server's (escaped) message.
func answerError(id string, status int, body []byte) error {
	e, err := decodeError(body)
	if err != nil {
		return fmt.Errorf("%d %s: %w", status, http.StatusText(status), err)
	}
	msg := untrusted.Text(e.Message)
	switch {
	case status == http.StatusNotFound && e.Reason == metaserver.ReasonNotFound:
		return fmt.Errorf("%s: %w", msg, csidriver.ErrNotFound)
	case status == http.StatusConflict && e.Reason == metaserver.ReasonExists:
		return fmt.Errorf("%s: %w", msg, csidriver.ErrExists)
	case status == http.StatusConflict && e.Reason == metaserver.ReasonAttached:
		return fmt.Errorf("%s: %w", msg, csidriver.ErrAttached)
	case status == http.StatusConflict && e.Reason == metaserver.ReasonAttachedElsewhere && e.Node != "":
		return &csidriver.AttachedElsewhereError{ID: id, Node: e.Node}
	case status == http.StatusForbidden && e.Reason == metaserver.ReasonNotAttached:
		return fmt.Errorf("%s: %w", msg, csidriver.ErrNotAttached)
	case status == http.StatusNotFound && e.Reason == metaserver.ReasonNodeNotFound:
		return fmt.Errorf("%s: %w", msg, csidriver.ErrNodeNotFound)
	}
	return fmt.Errorf("%d %s: %s (%s)", status, http.StatusText(status), msg, untrusted.Text(e.Reason))
}

// decodeError parses and checks a refusal's body.
func decodeError(body []byte) (metaserver.VolumeError, error) {
	var e metaserver.VolumeError
	if err := strictjson.UnmarshalIgnoreUnknown(body, &e); err != nil {
		return metaserver.VolumeError{}, fmt.Errorf("decoding the refusal: %w", err)
	}
	if e.Reason == "" {
		return metaserver.VolumeError{}, errors.New("decoding the refusal: no reason")
	}
	if e.Node != "" {
		if err := volumestore.CheckNode(e.Node); err != nil {
			return metaserver.VolumeError{}, fmt.Errorf("decoding the refusal: %w", err)
		}
	}
	return e, nil
}

// decodeVolume parses a volume, verifies it is the one asked for and checks its fields.
func decodeVolume(body []byte, id string) (csidriver.Volume, error) {
	var v metaserver.Volume
	if err := strictjson.UnmarshalIgnoreUnknown(body, &v); err != nil {
		return csidriver.Volume{}, fmt.Errorf("decoding the volume: %w", err)
	}
	if v.ID != id {
		return csidriver.Volume{}, fmt.Errorf("the provider answered with volume %q", v.ID)
	}
	if v.Bytes < 1 || v.Bytes > volumestore.MaxBytes {
		return csidriver.Volume{}, fmt.Errorf("volume size %d: want 1..%d bytes", v.Bytes, volumestore.MaxBytes)
	}
	if v.AttachedTo != "" {
		if err := volumestore.CheckNode(v.AttachedTo); err != nil {
			return csidriver.Volume{}, fmt.Errorf("attached to: %w", err)
		}
	}
	return csidriver.Volume{ID: v.ID, Bytes: v.Bytes, AttachedTo: v.AttachedTo}, nil
}

// decodeSize parses an expansion's answer.
func decodeSize(body []byte) (int64, error) {
	var s struct {
		Bytes *int64 `json:"bytes"`
	}
	if err := strictjson.UnmarshalIgnoreUnknown(body, &s); err != nil {
		return 0, fmt.Errorf("decoding the size: %w", err)
	}
	if s.Bytes == nil || *s.Bytes < 1 || *s.Bytes > volumestore.MaxBytes {
		return 0, fmt.Errorf("decoding the size: want bytes of 1..%d", volumestore.MaxBytes)
	}
	return *s.Bytes, nil
}

// decodePath parses a device path and checks it is the volume's own backing file: absolute,
// clean, named <id>.img. The node half opens it as root, so nothing else may pass.
func decodePath(body []byte, id string) (string, error) {
	var p metaserver.VolumePath
	if err := strictjson.UnmarshalIgnoreUnknown(body, &p); err != nil {
		return "", fmt.Errorf("decoding the path: %w", err)
	}
	switch {
	case !filepath.IsAbs(p.Path) || filepath.Clean(p.Path) != p.Path:
		return "", fmt.Errorf("path %q: want a clean absolute path", p.Path)
	case filepath.Base(p.Path) != id+".img":
		return "", fmt.Errorf("path %q: want the volume's file %s.img", p.Path, id)
	}
	return p.Path, nil
}

func checkID(id string) error {
	if !csidriver.ValidID(id) {
		return fmt.Errorf("volume id %q: want vol- and 32 lower-case hex digits", id)
	}
	return nil
}

func checkRequest(id string, size int64) error {
	if err := checkID(id); err != nil {
		return err
	}
	if size < 1 || size > volumestore.MaxBytes {
		return fmt.Errorf("volume size %d: want 1..%d bytes", size, volumestore.MaxBytes)
	}
	return nil
}
