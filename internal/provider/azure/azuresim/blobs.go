package azuresim

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"

	azfake "github.com/Azure/azure-sdk-for-go/sdk/azcore/fake"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v8"
)

// pageBlob is the page blob behind a disk being uploaded: its size and the pages written.
type pageBlob struct {
	mu    sync.Mutex
	size  int64
	pages map[int64][]byte // by offset, 512-byte aligned
}

func (b *pageBlob) bytes() []byte {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]byte, b.size)
	for off, p := range b.pages {
		copy(out[off:], p)
	}
	return out
}

// ServeBlobs starts the blob endpoint, on loopback, until the returned function is called:
// the page blobs a disk's write access points at (uploads), and the VMs' serial logs (boot
// diagnostics), as Azure's storage serves them.
func (c *Cloud) ServeBlobs() (stop func()) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/bootdiagnostics/") {
			c.serveSerialLog(w, r)
			return
		}
		c.servePage(w, r)
	}))
	c.mu.Lock()
	c.blobURL = srv.URL
	c.mu.Unlock()
	return srv.Close
}

// servePage serves Put Page (PUT ?comp=page, x-ms-page-write: update, x-ms-range) on
// /disks/<disk ID>, for a disk whose write access is granted.
func (c *Cloud) servePage(w http.ResponseWriter, r *http.Request) {
	fail := func(status int, code string) {
		w.Header().Set("x-ms-error-code", code)
		http.Error(w, code, status)
	}
	id := strings.TrimPrefix(r.URL.Path, "/disks")
	if r.Method != http.MethodPut || r.URL.Query().Get("comp") != "page" || r.Header.Get("x-ms-page-write") != "update" {
		fail(http.StatusBadRequest, "UnsupportedOperation")
		return
	}
	if r.URL.Query().Get("sig") != "sim" {
		fail(http.StatusForbidden, "AuthenticationFailed")
		return
	}
	c.mu.Lock()
	b, ok := c.blobs[key(id)]
	c.mu.Unlock()
	if !ok {
		fail(http.StatusForbidden, "AuthorizationFailure") // no write access granted
		return
	}
	var from, to int64
	rng := r.Header.Get("x-ms-range")
	if _, err := fmt.Sscanf(rng, "bytes=%d-%d", &from, &to); err != nil || from%512 != 0 || (to+1)%512 != 0 || to < from || to >= b.size {
		fail(http.StatusRequestedRangeNotSatisfiable, "InvalidPageRange")
		return
	}
	data, err := io.ReadAll(io.LimitReader(r.Body, to-from+2))
	if err != nil || int64(len(data)) != to-from+1 {
		fail(http.StatusBadRequest, "InvalidHeaderValue")
		return
	}
	b.mu.Lock()
	b.pages[from] = data
	b.mu.Unlock()
	w.Header().Set("ETag", `"0x1"`)
	w.Header().Set("x-ms-blob-sequence-number", "0")
	w.Header().Set("x-ms-request-server-encrypted", "true")
	w.Header().Set("Content-Length", strconv.Itoa(0))
	w.WriteHeader(http.StatusCreated)
}

// serveDiskAccess serves a disk's write access for an upload: granted, it points at the page
// blob; revoked, the disk holds what was written.
func (c *Cloud) serveDiskAccess() {
	s := &c.compute.DisksServer
	s.BeginGrantAccess = func(_ context.Context, rg, name string, data armcompute.GrantAccessData, _ *armcompute.DisksClientBeginGrantAccessOptions) (azfake.PollerResponder[armcompute.DisksClientGrantAccessResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		d, err := find(c, rg, name, func(g *group) map[string]*armcompute.Disk { return g.disks })
		var out armcompute.DisksClientGrantAccessResponse
		switch {
		case err != nil:
		case c.blobURL == "":
			err = &apiError{http.StatusNotImplemented, "NotSimulated"} // ServeBlobs was not called
		case d.Properties.DiskState == nil || *d.Properties.DiskState != armcompute.DiskStateReadyToUpload ||
			data.Access == nil || *data.Access != armcompute.AccessLevelWrite:
			err = conflict("OperationNotAllowed")
		default:
			g, _ := c.groupOf(rg)
			g.disks[key(name)].Properties.DiskState = ptr(armcompute.DiskStateActiveUpload)
			c.blobs[key(*d.ID)] = &pageBlob{size: *d.Properties.CreationData.UploadSizeBytes, pages: map[int64][]byte{}}
			out.AccessURI = armcompute.AccessURI{AccessSAS: ptr(c.blobURL + "/disks" + *d.ID + "?sv=2020-08-04&sr=b&sig=sim")}
		}
		return lro(c, "DisksClient.BeginGrantAccess", out, err, nil)
	}
	s.BeginRevokeAccess = func(_ context.Context, rg, name string, _ *armcompute.DisksClientBeginRevokeAccessOptions) (azfake.PollerResponder[armcompute.DisksClientRevokeAccessResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		d, err := find(c, rg, name, func(g *group) map[string]*armcompute.Disk { return g.disks })
		if err == nil && d.Properties.DiskState != nil && *d.Properties.DiskState == armcompute.DiskStateActiveUpload {
			g, _ := c.groupOf(rg)
			g.disks[key(name)].Properties.DiskState = ptr(armcompute.DiskStateUnattached)
		}
		return lro(c, "DisksClient.BeginRevokeAccess", armcompute.DisksClientRevokeAccessResponse{}, err, nil)
	}
}
