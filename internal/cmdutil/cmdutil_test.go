package cmdutil_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/cmdutil"
	"github.com/openconstellation/constellation/internal/testnet"
)

func TestParseFlags(t *testing.T) {
	for name, tc := range map[string]struct {
		args    []string
		env     map[string]string
		want    map[string]string
		wantErr string
	}{
		"defaults":          {want: map[string]string{"tpm": "unix:/run/constellation/tpm.sock", "log-level": "info", "port": "1"}},
		"environment":       {env: map[string]string{"CONSTELLATION_TPM": "tcp:127.0.0.1:2321", "CONSTELLATION_LOG_LEVEL": "debug"}, want: map[string]string{"tpm": "tcp:127.0.0.1:2321", "log-level": "debug"}},
		"command line wins": {args: []string{"--tpm=unix:/tmp/x.sock"}, env: map[string]string{"CONSTELLATION_TPM": "tcp:127.0.0.1:2321"}, want: map[string]string{"tpm": "unix:/tmp/x.sock"}},
		"bad env value":     {env: map[string]string{"CONSTELLATION_PORT": "many"}, wantErr: "CONSTELLATION_PORT"},
		"extra argument":    {args: []string{"serve"}, wantErr: `unexpected arguments: ["serve"]`},
		"unknown flag":      {args: []string{"--nope"}, wantErr: "flag provided but not defined"},
	} {
		t.Run(name, func(t *testing.T) {
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			fs.String("tpm", "unix:/run/constellation/tpm.sock", "")
			fs.String("log-level", "info", "")
			fs.Int("port", 1, "")
			err := cmdutil.ParseFlags(fs, tc.args, "CONSTELLATION_", func(k string) string { return tc.env[k] })
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			for k, v := range tc.want {
				assert.Equal(t, v, fs.Lookup(k).Value.String(), k)
			}
		})
	}
}

func TestLogger(t *testing.T) {
	var buf bytes.Buffer
	log, err := cmdutil.Logger(&buf, "warn")
	require.NoError(t, err)
	log.Info("hidden")
	log.Warn("shown", "k", "v")
	var line map[string]any
	require.NoError(t, json.Unmarshal(buf.Bytes(), &line))
	assert.Equal(t, "shown", line["msg"])
	assert.Equal(t, "v", line["k"])
	_, err = cmdutil.Logger(&buf, "loud")
	assert.ErrorContains(t, err, `log level "loud"`)
}

func TestRun(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	addr := testnet.Addr(t)
	reg := cmdutil.Registry()
	metricsAddr := testnet.Addr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- cmdutil.Run(ctx, log, cmdutil.HTTP("hello", addr, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			_, _ = w.Write([]byte("hello"))
		}), nil), cmdutil.Metrics(metricsAddr, reg))
	}()
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + addr + "/")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 5*time.Second, 20*time.Millisecond)
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Contains(t, string(body), "go_goroutines")
	cancel()
	select {
	case err := <-done:
		assert.NoError(t, err, "a stop by the context is clean")
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return after the context ended")
	}

	// An address in use: Run fails naming the server, and serves nothing.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	err = cmdutil.Run(context.Background(), log, cmdutil.HTTP("first", testnet.Addr(t), http.NotFoundHandler(), nil), cmdutil.HTTP("second", ln.Addr().String(), http.NotFoundHandler(), nil))
	assert.ErrorContains(t, err, "second: listen tcp")
}
