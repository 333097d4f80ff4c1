package azuresim

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	azfake "github.com/Azure/azure-sdk-for-go/sdk/azcore/fake"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v8"
)

// serveBootDiagnostics serves a VM's boot diagnostics: a read-only SAS link to its serial
// log, on the blob endpoint (ServeBlobs), whose content Hooks.Console gives.
func (c *Cloud) serveBootDiagnostics() {
	s := &c.compute.VirtualMachinesServer
	s.RetrieveBootDiagnosticsData = func(_ context.Context, rg, name string, _ *armcompute.VirtualMachinesClientRetrieveBootDiagnosticsDataOptions) (azfake.Responder[armcompute.VirtualMachinesClientRetrieveBootDiagnosticsDataResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		_, err := find(c, rg, name, func(g *group) map[string]*vm { return g.vms })
		var out armcompute.VirtualMachinesClientRetrieveBootDiagnosticsDataResponse
		switch {
		case err != nil:
		case c.blobURL == "":
			err = &apiError{http.StatusNotImplemented, "NotSimulated"} // ServeBlobs was not called
		default:
			out.SerialConsoleLogBlobURI = ptr(fmt.Sprintf("%s/bootdiagnostics/%s/%s/serialconsole.log?sv=2020-08-04&sr=b&sp=r&sig=sim", c.blobURL, rg, name))
		}
		return respond(out, err)
	}
}

// serveSerialLog serves Get Blob and Get Blob Properties of a VM's serial log at
// /bootdiagnostics/<group>/<vm>/serialconsole.log, with a byte range or without.
func (c *Cloud) serveSerialLog(w http.ResponseWriter, r *http.Request) {
	fail := func(status int, code string) {
		w.Header().Set("x-ms-error-code", code)
		http.Error(w, code, status)
	}
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/bootdiagnostics/"), "/")
	if len(parts) != 3 || (r.Method != http.MethodGet && r.Method != http.MethodHead) {
		fail(http.StatusBadRequest, "UnsupportedOperation")
		return
	}
	if r.URL.Query().Get("sig") != "sim" {
		fail(http.StatusForbidden, "AuthenticationFailed")
		return
	}
	rg, name := parts[0], parts[1]
	if _, ok := c.VM(rg, name); !ok {
		fail(http.StatusNotFound, "BlobNotFound")
		return
	}
	var log []byte
	if c.hooks.Console != nil {
		log = c.hooks.Console(rg, name)
	}
	body := log
	rng := r.Header.Get("x-ms-range")
	if rng == "" {
		rng = r.Header.Get("Range")
	}
	status := http.StatusOK
	if rng != "" {
		var from, to int64
		if _, err := fmt.Sscanf(rng, "bytes=%d-%d", &from, &to); err != nil || from < 0 || to < from || from >= int64(len(log)) {
			fail(http.StatusRequestedRangeNotSatisfiable, "InvalidRange")
			return
		}
		to = min(to, int64(len(log))-1)
		body = log[from : to+1]
		w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", from, to, len(log)))
		status = http.StatusPartialContent
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.Header().Set("x-ms-blob-type", "AppendBlob")
	w.Header().Set("ETag", `"0x1"`)
	w.WriteHeader(status)
	if r.Method == http.MethodGet {
		_, _ = w.Write(body)
	}
}
