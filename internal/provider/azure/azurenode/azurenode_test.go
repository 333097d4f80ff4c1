package azurenode

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/bootstrapper/boot"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider/azure/azuremeta"
	"github.com/openconstellation/constellation/pkg/attestation/azure"
	"github.com/openconstellation/constellation/pkg/attestation/azure/azuretest"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/vtpmtest"
)

// TestVariant: the node's variant is its vTPM's HCL report's: SEV-SNP or TDX; a vTPM
// without one is no Azure confidential VM.
func TestVariant(t *testing.T) {
	if testing.Short() {
		t.Skip("starts swtpm")
	}
	for typ, want := range map[azure.ReportType]variant.Variant{azure.ReportTypeSNP: variant.AzureSEVSNP, azure.ReportTypeTDX: variant.AzureTDX} {
		proc := vtpmtest.SwtpmProcess(t)
		tpm, err := proc.Open(t.Context())
		require.NoError(t, err)
		require.NoError(t, tpm.WriteNV(azure.HCLReportNVIndex, azuretest.HCLReport(typ, make([]byte, 1184), []byte(`{"keys":[]}`), 0)))
		require.NoError(t, tpm.Close()) // swtpm serves one connection at a time
		got, err := Variant(t.Context(), proc.Open)
		require.NoError(t, err)
		assert.Equal(t, want, got)
	}
	proc := vtpmtest.SwtpmProcess(t)
	_, err := Variant(t.Context(), vtpm.Opener(proc.Open))
	assert.ErrorContains(t, err, "reading the HCL report (NV index 0x1400001): not an Azure confidential VM?")
}

type staticLister []metadata.Instance

func (s staticLister) Instances(context.Context) ([]metadata.Instance, error) { return s, nil }

func TestMetadata(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("testdata", "instance.json"))
	require.NoError(t, err)
	imds := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(doc) }))
	t.Cleanup(imds.Close)
	var console bytes.Buffer
	booted := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	p := newPlatform(boot.PlatformConfig{MetadataURL: imds.URL}, variant.AzureSEVSNP, &console, booted)
	p.meta.lister = staticLister{
		{Name: "control-plane-0", Role: metadata.ControlPlane, IPs: []netip.Addr{netip.MustParseAddr("10.9.0.4")}},
		{Name: "worker-0", Role: metadata.Worker, IPs: []netip.Addr{netip.MustParseAddr("10.9.0.5")}},
		{Name: "control-plane-1", Role: metadata.ControlPlane, IPs: []netip.Addr{netip.MustParseAddr("10.9.0.6")}},
	}
	ctx := t.Context()
	m, err := p.Metadata(ctx)
	require.NoError(t, err)

	self, err := m.Self(ctx)
	require.NoError(t, err)
	assert.Equal(t, "control-plane-0", self.Name)
	hash, err := m.InitSecretHash(ctx)
	require.NoError(t, err)
	assert.Equal(t, "$2a$10$abc", string(hash))
	api, err := m.APIEndpoint(ctx)
	require.NoError(t, err)
	assert.Equal(t, "203.0.113.1:6443", api)
	eps, err := m.JoinEndpoints(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"10.9.0.4:30090", "10.9.0.6:30090"}, eps, "control planes only")

	require.NoError(t, m.ReportDetail(ctx, "waiting-for-recovery", "no join service answers"))
	assert.Equal(t, "constellation: phase waiting-for-recovery boot 2026-11-30T08:00:00Z: \"no join service answers\"\n", console.String())
	r, ok := azuremeta.LastConsoleReport(console.Bytes())
	require.True(t, ok, "the host half reads back what the node wrote")
	assert.Equal(t, azuremeta.ConsoleReport{Phase: "waiting-for-recovery", Detail: "no join service answers", Boot: booted}, r)

	v, env := p.Attestation()
	assert.Equal(t, variant.AzureSEVSNP, v)
	assert.NotNil(t, env.AzureCertificates)
	facts := p.Services()
	require.NoError(t, facts.Validate())
	assert.Equal(t, "azure", facts.Name)
}

func TestBootTime(t *testing.T) {
	stat := filepath.Join(t.TempDir(), "stat")
	require.NoError(t, os.WriteFile(stat, []byte("cpu  1 2 3\nbtime 1796026800\nprocesses 9\n"), 0o644))
	assert.Equal(t, time.Unix(1796026800, 0), bootTime(stat))
	before := time.Now()
	assert.False(t, bootTime(filepath.Join(t.TempDir(), "none")).Before(before), "unreadable: now")
}

// TestReportsAreWrittenAgain: the host half reads the serial log's end only, so the node's
// last report is written again while the node runs.
func TestReportsAreWrittenAgain(t *testing.T) {
	var console bytes.Buffer
	m := &nodeMetadata{console: &console, boot: time.Unix(0, 0), again: 10 * time.Millisecond}
	text := func() string {
		m.reportMu.Lock()
		defer m.reportMu.Unlock()
		return console.String()
	}
	require.NoError(t, m.ReportDetail(t.Context(), "joined", ""))
	line := azuremeta.ConsoleReport{Phase: "joined", Boot: time.Unix(0, 0)}.Line()
	require.Eventually(t, func() bool { return strings.Count(text(), line) >= 3 }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, m.ReportDetail(t.Context(), "rejoined", ""))
	require.Eventually(t, func() bool {
		r, ok := azuremeta.LastConsoleReport([]byte(text()))
		return ok && r.Phase == "rejoined" && strings.Count(text(), "phase rejoined") >= 2
	}, 10*time.Second, 5*time.Millisecond, "the newest report is the one written again")
}
