package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/attestation/softfirmware"
	"github.com/openconstellation/constellation/internal/cmdutil"
	"github.com/openconstellation/constellation/internal/provider/local"
	"github.com/openconstellation/constellation/internal/testnet"
	"github.com/openconstellation/constellation/internal/verifyservice"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/qemu"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/vtpmtest"
	"github.com/openconstellation/constellation/pkg/verify"
)

// The service starts from flags and environment, answers over HTTP and gRPC with evidence of
// the TPM it opens per request, serves metrics, and stops cleanly when told to.
func TestRun(t *testing.T) {
	proc := vtpmtest.SwtpmProcess(t)
	// The node's measured boot, as the provider plays it: PCRs and the event log the
	// service sends (qemu-vtpm validators require it).
	image := []softfirmware.Component{softfirmware.BytesComponent("bootstrapper", local.PCRBootstrapper, []byte("bootstrapper v1"))}
	tpm, err := proc.Open(context.Background())
	require.NoError(t, err)
	bootLog, err := softfirmware.MeasureLogged(tpm, image)
	require.NoError(t, err)
	require.NoError(t, tpm.Close())
	logPath := filepath.Join(t.TempDir(), "eventlog")
	require.NoError(t, os.WriteFile(logPath, bootLog, 0o600))
	grpcAddr, httpAddr, metricsAddr := testnet.Addr(t), testnet.Addr(t), testnet.Addr(t)
	env := map[string]string{"CONSTELLATION_TPM": proc.Addr(), "CONSTELLATION_AK": "ecc", "CONSTELLATION_HTTP_LISTEN": httpAddr}
	ctx, cancel := context.WithCancel(context.Background())
	var logs cmdutil.SyncBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--grpc-listen=" + grpcAddr, "--metrics-listen=" + metricsAddr, "--event-log=" + logPath, "--variant=qemu-vtpm"}, func(k string) string { return env[k] }, &logs)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			assert.NoError(t, err)
		case <-time.After(15 * time.Second):
			t.Error("run did not return after the context ended")
		}
	})

	// This TPM's AK is not certified: the validator accepts that, so the evidence verifies.
	val, err := qemu.NewValidator(qemu.ValidatorConfig{ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: measurements.ReferenceSets{{Name: "fresh TPM", Measurements: softfirmware.ExpectedPCRs(image)}}}, AcceptUnauthenticatedAK: true})
	require.NoError(t, err)
	nonce := bytes.Repeat([]byte{7}, 16)
	var body verifyservice.HTTPResponse
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + httpAddr + "/v1/attest?nonce=" + hex.EncodeToString(nonce))
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		return resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&body) == nil
	}, 10*time.Second, 50*time.Millisecond)
	ev, err := base64.StdEncoding.DecodeString(body.Evidence)
	require.NoError(t, err)
	_, err = val.Validate(ctx, ev, attestation.PurposeVerify, nonce)
	require.NoError(t, err)

	// gRPC: the CLI's client; this TPM's AK is not certified, so the evidence verifies but
	// cannot be tied to the node asked about.
	res, err := verify.Verify(ctx, "node-0", grpcAddr, val, bytes.Repeat([]byte{1}, 32))
	assert.ErrorIs(t, err, verify.ErrWrongNode)
	require.NotNil(t, res)
	assert.Equal(t, "fresh TPM", res.ReferenceSet)

	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	require.NoError(t, err)
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Contains(t, string(metrics), `constellation_verificationservice_requests_total{protocol="http",result="ok"} 1`)
	assert.Contains(t, logs.String(), `"msg":"verification service starting"`)
	assert.Contains(t, logs.String(), `"ak":"ecc"`)
}

// The service as the binary wires it, on a real swtpm: a caller asking again and again is
// refused (429) after its burst, before the TPM is used; the metrics count both.
func TestRunLimitsCallers(t *testing.T) {
	proc := vtpmtest.SwtpmProcess(t)
	counter := vtpmtest.CountQuotes(t, proc.Addr())
	httpAddr, metricsAddr := testnet.Addr(t), testnet.Addr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	// One request per 1000 s: no token refills while the test runs.
	args := []string{"--tpm=" + counter.Addr(), "--grpc-listen=" + testnet.Addr(t), "--http-listen=" + httpAddr, "--metrics-listen=" + metricsAddr, "--peer-rate=0.001", "--peer-burst=2", "--variant=qemu-vtpm"}
	go func() { done <- run(ctx, args, func(string) string { return "" }, io.Discard) }()
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-done)
	})
	nonce := hex.EncodeToString(bytes.Repeat([]byte{7}, 16))
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.11.1")}}
	client := &http.Client{Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}, Timeout: time.Minute}
	// Wait for the server with another caller's address (its attempts are its own).
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + metricsAddr + "/metrics")
		if err != nil {
			return false
		}
		resp.Body.Close()
		c, err := net.Dial("tcp", httpAddr)
		if err != nil {
			return false
		}
		c.Close()
		return true
	}, 10*time.Second, 50*time.Millisecond)
	// Warm up from another caller: the first evidence of a fresh swtpm may take a second
	// quote (vtpm.Issuer quotes again when the PCR digest does not match its read).
	warm, err := http.Get("http://" + httpAddr + "/v1/attest?nonce=" + nonce)
	require.NoError(t, err)
	warm.Body.Close()
	require.Equal(t, http.StatusOK, warm.StatusCode)
	before := counter.Quotes()
	var codes []int
	for range 6 {
		resp, err := client.Get("http://" + httpAddr + "/v1/attest?nonce=" + nonce)
		require.NoError(t, err)
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
	}
	assert.Equal(t, []int{200, 200, 429, 429, 429, 429}, codes)
	assert.Equal(t, 2, counter.Quotes()-before, "quotes the swtpm signed for six requests")
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	require.NoError(t, err)
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Contains(t, string(metrics), `constellation_verificationservice_requests_total{protocol="http",result="ok"} 3`)
	assert.Contains(t, string(metrics), `constellation_verificationservice_requests_total{protocol="http",result="rate-limited"} 4`)
}

func TestRunRefuses(t *testing.T) {
	none := func(string) string { return "" }
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"unknown AK":      {args: []string{"--variant=qemu-vtpm", "--ak=dsa"}, want: `--ak "dsa": want rsa or ecc`},
		"unknown variant": {args: []string{"--variant=tpm-9000"}, want: `unknown attestation variant "tpm-9000"`},
		"no variant":      {args: []string{}, want: "--variant is required"},
		"no TPM":          {args: []string{"--variant=qemu-vtpm", "--tpm=unix:/nonexistent/tpm.sock"}, want: "TPM: connecting to TPM at unix:/nonexistent/tpm.sock"},
		"bad log level":   {args: []string{"--log-level=loud"}, want: `log level "loud"`},
		"zero peer rate":  {args: []string{"--peer-rate=0"}, want: "--peer-rate 0: must be positive"},
	} {
		t.Run(name, func(t *testing.T) {
			err := run(context.Background(), tc.args, none, io.Discard)
			assert.ErrorContains(t, err, tc.want)
		})
	}
}
