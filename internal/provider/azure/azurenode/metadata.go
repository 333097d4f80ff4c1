package azurenode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/openconstellation/constellation/internal/deploy"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider/azure/azuremeta"
)

// nodeMetadata is what a node learns from Azure (boot.Metadata): itself, the init secret's
// hash and the API endpoint from its VM's tags through IMDS, the join endpoints from the
// cluster's instances (Resource Manager, the nodes' identity). Phase reports go to the
// VM's serial console, which Azure's boot diagnostics keep.
type nodeMetadata struct {
	imds    azuremeta.IMDS
	lister  metadata.Lister
	console io.Writer
	// boot is when the machine booted, which each report names.
	boot time.Time
	// again is how often the last report is written again (reportAgain).
	again time.Duration

	mu   sync.Mutex
	inst *azuremeta.Instance

	// reportMu guards the console and the last report's line.
	reportMu  sync.Mutex
	last      string
	repeating bool
}

// reportAgain is how often a node writes its last report to the console again: the host half
// reads the serial log's end only, which the kernel's and other programs' lines would push a
// report out of in time.
const reportAgain = time.Minute

// instance asks IMDS once per boot: the VM's tags do not change under a running node.
func (m *nodeMetadata) instance(ctx context.Context) (azuremeta.Instance, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.inst != nil {
		return *m.inst, nil
	}
	inst, err := m.imds.Instance(ctx)
	if err != nil {
		return azuremeta.Instance{}, err
	}
	m.inst = &inst
	return inst, nil
}

// Self implements metadata.Provider.
func (m *nodeMetadata) Self(ctx context.Context) (metadata.Instance, error) {
	inst, err := m.instance(ctx)
	if err != nil {
		return metadata.Instance{}, err
	}
	return inst.Self()
}

// JoinEndpoints implements metadata.Provider: every control plane's join service.
func (m *nodeMetadata) JoinEndpoints(ctx context.Context) ([]string, error) {
	instances, err := m.lister.Instances(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, i := range instances {
		if i.Role == metadata.ControlPlane && len(i.IPs) > 0 {
			out = append(out, net.JoinHostPort(i.IPs[0].String(), strconv.Itoa(deploy.JoinServicePort)))
		}
	}
	return out, nil
}

// InitSecretHash implements metadata.Provider: a control plane's tag.
func (m *nodeMetadata) InitSecretHash(ctx context.Context) ([]byte, error) {
	inst, err := m.instance(ctx)
	if err != nil {
		return nil, err
	}
	if h := inst.InitSecretHash(); h != nil {
		return h, nil
	}
	return nil, errors.New("the VM carries no init secret hash: only control planes are initialized")
}

// APIEndpoint implements metadata.Provider: the load balancer's public address, from a tag
// (only where to connect: the API server's certificate is checked).
func (m *nodeMetadata) APIEndpoint(ctx context.Context) (string, error) {
	inst, err := m.instance(ctx)
	if err != nil {
		return "", err
	}
	ep := inst.Tags[azuremeta.TagAPIEndpoint]
	if _, _, err := net.SplitHostPort(ep); err != nil {
		return "", fmt.Errorf("the VM's %s tag %q: %w", azuremeta.TagAPIEndpoint, ep, err)
	}
	return ep, nil
}

// ReportDetail implements metadata.Reporter: one line on the serial console, which the host
// half reads back through boot diagnostics (azuremeta.ConsoleReport).
func (m *nodeMetadata) ReportDetail(_ context.Context, phase, detail string) error {
	m.reportMu.Lock()
	defer m.reportMu.Unlock()
	m.last = azuremeta.ConsoleReport{Phase: phase, Detail: detail, Boot: m.boot}.Line()
	if !m.repeating && m.again > 0 {
		m.repeating = true
		go m.repeat()
	}
	_, err := io.WriteString(m.console, m.last)
	return err
}

// repeat writes the last report again every m.again, for the node's life.
func (m *nodeMetadata) repeat() {
	for range time.Tick(m.again) {
		m.reportMu.Lock()
		_, _ = io.WriteString(m.console, m.last)
		m.reportMu.Unlock()
	}
}
