package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"github.com/openconstellation/constellation/internal/attestation"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/attestation/measurements"
	"github.com/openconstellation/constellation/internal/attestation/measurements/measurementstest"
	"github.com/openconstellation/constellation/internal/attestation/qemu"
	"github.com/openconstellation/constellation/internal/attestation/vtpm/vtpmtest"
	"github.com/openconstellation/constellation/internal/cmdutil"
	"github.com/openconstellation/constellation/internal/verify"
)

// The service starts from flags and environment, answers over HTTP and gRPC with evidence of
// the TPM it opens per request, serves metrics, and stops cleanly when told to.
func TestRun(t *testing.T) {
	proc := vtpmtest.SwtpmProcess(t)
	grpcAddr, httpAddr, metricsAddr := freeAddr(t), freeAddr(t), freeAddr(t)
	env := map[string]string{"CONSTELLATION_TPM": proc.Addr(), "CONSTELLATION_AK": "ecc", "CONSTELLATION_HTTP_LISTEN": httpAddr}
	ctx, cancel := context.WithCancel(context.Background())
	var logs cmdutil.SyncBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--grpc-listen=" + grpcAddr, "--metrics-listen=" + metricsAddr}, func(k string) string { return env[k] }, &logs)
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

	val, err := qemu.NewValidator(qemu.ValidatorConfig{ReferenceSets: measurements.ReferenceSets{{Name: "fresh TPM", Measurements: measurementstest.Image(qemu.Variant, nil)}}})
	require.NoError(t, err)
	nonce := bytes.Repeat([]byte{7}, 16)
	var body verify.HTTPResponse
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

func TestRunRefuses(t *testing.T) {
	none := func(string) string { return "" }
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"unknown AK":      {args: []string{"--ak=dsa"}, want: `--ak "dsa": want rsa or ecc`},
		"unknown variant": {args: []string{"--variant=tpm-9000"}, want: `unknown attestation variant "tpm-9000"`},
		"no TPM":          {args: []string{"--tpm=unix:/nonexistent/tpm.sock"}, want: "TPM: connecting to TPM at unix:/nonexistent/tpm.sock"},
		"bad log level":   {args: []string{"--log-level=loud"}, want: `log level "loud"`},
	} {
		t.Run(name, func(t *testing.T) {
			err := run(context.Background(), tc.args, none, io.Discard)
			assert.ErrorContains(t, err, tc.want)
		})
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}
