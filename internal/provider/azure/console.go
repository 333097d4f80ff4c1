package azure

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"regexp"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v8"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blob"

	"github.com/openconstellation/constellation/internal/provider/azure/azuremeta"
)

// A node reports its phases on its VM's serial console (azuremeta.ConsoleReport), which
// Azure's boot diagnostics keep as a blob; the host half reads the last report from the end of
// that blob, through a read-only link Resource Manager hands out. The link is kept while it
// is valid: listing the nodes while the CLI waits costs one Resource Manager call per node
// and link, not per listing.
const (
	// serialLogTail is how much of a serial log's end is read.
	serialLogTail = 64 << 10
	// serialLinkMinutes is how long a link is asked to be valid; it is asked for again
	// serialLinkMargin before it ends.
	serialLinkMinutes = 30
	serialLinkMargin  = 2 * time.Minute
)

// serialLogs are the serial log links of a cluster's VMs.
type serialLogs struct {
	mu    sync.Mutex
	links map[string]serialLink // by VM name
}

type serialLink struct {
	url     string
	expires time.Time
}

// lastReport returns the last phase report on the VM's serial console of the boot the
// provider last asked for (earlierBoot), and whether there is one.
func (c *Cluster) lastReport(ctx context.Context, v vmNode) (azuremeta.ConsoleReport, bool, error) {
	name := v.spec.Name
	link, err := c.serialLink(ctx, name)
	if err != nil {
		return azuremeta.ConsoleReport{}, false, err
	}
	tail, err := readTail(ctx, link)
	if err != nil {
		if ctx.Err() == nil {
			c.serial.mu.Lock()
			delete(c.serial.links, name) // expired or revoked: ask for a new one next time
			c.serial.mu.Unlock()
		}
		// The link's query is its signature: it stays out of messages.
		return azuremeta.ConsoleReport{}, false, fmt.Errorf("reading the serial log of VM %s: %w", name, redactedError{err: err})
	}
	r, ok := azuremeta.LastConsoleReport(tail)
	return r, ok && !earlierBoot(r, v.vm.Tags), nil
}

// tagBootAsked is when the provider last asked Azure to start or restart a VM (RFC 3339).
const tagBootAsked = "constellation-boot-asked"

// bootSkew is how far a node's clock may be behind the CLI's machine's for its report to
// count as of the boot asked for. Azure's VMs keep the host's time; the CLI's wait for a
// reboot already compares the node's boot with its own clock to a second.
const bootSkew = 5 * time.Second

// earlierBoot says whether r is of a boot before the one the provider last asked for: the
// serial log keeps what the node wrote before, until it reports again.
func earlierBoot(r azuremeta.ConsoleReport, tags map[string]*string) bool {
	asked, err := time.Parse(time.RFC3339, tag(tags, tagBootAsked))
	return err == nil && r.Boot.Before(asked.Add(-bootSkew))
}

// markBoot records on the VM, before the provider starts or restarts it, when it asked for
// the boot (tagBootAsked): a report on the serial log of an earlier boot is then told from the
// new boot's (lastReport), whichever CLI command reads it.
func (c *Cluster) markBoot(ctx context.Context, v vmNode) error {
	tags := maps.Clone(v.vm.Tags)
	if tags == nil {
		tags = map[string]*string{}
	}
	tags[tagBootAsked] = ptr(time.Now().UTC().Format(time.RFC3339))
	_, err := put(ctx, c.clients, "tag VM "+v.spec.Name, func(ctx context.Context) (*runtime.Poller[armcompute.VirtualMachinesClientUpdateResponse], error) {
		return c.clients.vms.BeginUpdate(ctx, c.rec.Layout.ResourceGroup, v.spec.Name, armcompute.VirtualMachineUpdate{Tags: tags}, nil)
	})
	return err
}

// redactedError is err with every URL's query (a link's signature) left out of its text.
type redactedError struct{ err error }

// urlQuery is a URL's query in an error's text (the SDK may quote the URL, its query
// reordered).
var urlQuery = regexp.MustCompile(`(https?://[^\s"?]+)\?[^\s"]*`)

func (e redactedError) Error() string {
	return urlQuery.ReplaceAllString(e.err.Error(), "$1?<query>")
}

func (e redactedError) Unwrap() error { return e.err }

// serialLink returns a valid link to VM name's serial log.
func (c *Cluster) serialLink(ctx context.Context, name string) (string, error) {
	c.serial.mu.Lock()
	l, ok := c.serial.links[name]
	c.serial.mu.Unlock()
	if ok && time.Until(l.expires) > serialLinkMargin {
		return l.url, nil
	}
	asked := time.Now()
	var res armcompute.VirtualMachinesClientRetrieveBootDiagnosticsDataResponse
	if err := c.clients.call(ctx, "read the boot diagnostics of VM "+name, func(ctx context.Context) error {
		var err error
		res, err = c.clients.vms.RetrieveBootDiagnosticsData(ctx, c.rec.Layout.ResourceGroup, name,
			&armcompute.VirtualMachinesClientRetrieveBootDiagnosticsDataOptions{SasURIExpirationTimeInMinutes: ptr(int32(serialLinkMinutes))})
		return err
	}); err != nil {
		return "", err
	}
	if res.SerialConsoleLogBlobURI == nil || *res.SerialConsoleLogBlobURI == "" {
		return "", errors.New("no serial log of the VM in its boot diagnostics (are they off?)")
	}
	c.serial.mu.Lock()
	c.serial.links[name] = serialLink{url: *res.SerialConsoleLogBlobURI, expires: asked.Add(serialLinkMinutes * time.Minute)}
	c.serial.mu.Unlock()
	return *res.SerialConsoleLogBlobURI, nil
}

// readTail reads the last serialLogTail bytes of the blob at link (the link authorizes).
func readTail(ctx context.Context, link string) ([]byte, error) {
	client, err := blob.NewClientWithNoCredential(link, &blob.ClientOptions{ClientOptions: azcore.ClientOptions{
		Retry: policy.RetryOptions{MaxRetries: 2, RetryDelay: 200 * time.Millisecond, MaxRetryDelay: time.Second},
	}})
	if err != nil {
		return nil, err
	}
	props, err := client.GetProperties(ctx, nil)
	if err != nil {
		return nil, err
	}
	if props.ContentLength == nil || *props.ContentLength == 0 {
		return nil, nil
	}
	size := *props.ContentLength
	from := max(0, size-serialLogTail)
	res, err := client.DownloadStream(ctx, &blob.DownloadStreamOptions{Range: blob.HTTPRange{Offset: from, Count: size - from}})
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	return io.ReadAll(io.LimitReader(res.Body, serialLogTail))
}
