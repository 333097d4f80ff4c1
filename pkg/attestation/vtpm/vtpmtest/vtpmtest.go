// Package vtpmtest provides TPMs for tests: the go-tpm-tools simulator (in-process, fast, one
// per process at a time) and real swtpm processes. Only tests import it, so the cgo simulator
// never ends up in a production binary.
package vtpmtest

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm-tools/simulator"
	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/pkg/attestation/eventlog/eventlogtest"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/measurements/measurementstest"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/swtpm"
)

// Simulator returns a fresh simulator TPM, closed when the test ends. The simulator is a
// process-wide singleton: tests using it must not run in parallel.
func Simulator(t testing.TB) *vtpm.TPM {
	t.Helper()
	sim, err := simulator.Get()
	require.NoError(t, err)
	tpm := vtpm.New(sim, "simulator")
	t.Cleanup(func() { _ = tpm.Close() })
	return tpm
}

// SimulatorFixedSeed returns a simulator whose seeds, and so whose attestation key, are the
// same in every process: fuzz workers (separate processes) then share the AK of the seed
// corpus. Insecure by design; tests only.
func SimulatorFixedSeed(t testing.TB, seed int64) *vtpm.TPM {
	t.Helper()
	sim, err := simulator.GetWithFixedSeedInsecure(seed)
	require.NoError(t, err)
	tpm := vtpm.New(sim, "simulator")
	t.Cleanup(func() { _ = tpm.Close() })
	return tpm
}

// Swtpm starts a swtpm process and returns an open connection to it; both end with the test.
func Swtpm(t testing.TB) (*vtpm.TPM, *swtpm.Process) {
	t.Helper()
	proc := SwtpmProcess(t)
	tpm, err := proc.Open(context.Background())
	require.NoError(t, err)
	t.Cleanup(func() { _ = tpm.Close() })
	return tpm, proc
}

// SwtpmProcess starts a swtpm process, stopped when the test ends, without connecting to it:
// for code that opens the TPM per use (swtpm serves one connection at a time). A real swtpm
// is the integration tier's (internal/testtier): under go test -short the test is skipped.
func SwtpmProcess(t testing.TB) *swtpm.Process {
	t.Helper()
	if testing.Short() {
		t.Skip("integration tier (make integration): runs swtpm")
	}
	// os.MkdirTemp, not t.TempDir: test names can push a socket path past 107 bytes.
	dir, err := os.MkdirTemp("", "swtpm")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	proc, err := swtpm.Start(context.Background(), swtpm.Options{StateDir: dir})
	require.NoError(t, err)
	t.Cleanup(func() { _ = proc.Stop() })
	return proc
}

// tpmCCQuote is the command code of TPM2_Quote (TPM 2.0 Part 2, 6.5.2).
const tpmCCQuote = 0x00000158

// QuoteCounter forwards TPM connections to a TPM server and counts the TPM2_Quote commands
// that pass: the quotes a process made the real TPM sign.
type QuoteCounter struct {
	ln     net.Listener
	quotes atomic.Int32
}

// CountQuotes listens on a unix socket in front of the TPM server at addr ("unix:PATH") and
// returns the counter; Addr is what the code under test opens instead. It stops with t.
func CountQuotes(t testing.TB, addr string) *QuoteCounter {
	t.Helper()
	dir, err := os.MkdirTemp("", "tpmcount")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	ln, err := net.Listen("unix", filepath.Join(dir, "tpm.sock"))
	require.NoError(t, err)
	q := &QuoteCounter{ln: ln}
	t.Cleanup(func() { _ = ln.Close() })
	upstream := strings.TrimPrefix(addr, "unix:")
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			go q.forward(client, upstream)
		}
	}()
	return q
}

// Addr is the counter's address, for vtpm.Open.
func (q *QuoteCounter) Addr() string { return "unix:" + q.ln.Addr().String() }

// Quotes is the number of TPM2_Quote commands forwarded so far.
func (q *QuoteCounter) Quotes() int { return int(q.quotes.Load()) }

func (q *QuoteCounter) forward(client net.Conn, upstream string) {
	defer client.Close()
	server, err := net.Dial("unix", upstream)
	if err != nil {
		return
	}
	defer server.Close()
	go func() { _, _ = io.Copy(client, server) }()
	// Commands: tag (2 bytes), size (4, including the header), command code (4).
	for {
		var hdr [10]byte
		if _, err := io.ReadFull(client, hdr[:]); err != nil {
			return
		}
		size := binary.BigEndian.Uint32(hdr[2:6])
		if size < 10 || size > 1<<16 {
			return
		}
		if binary.BigEndian.Uint32(hdr[6:10]) == tpmCCQuote {
			q.quotes.Add(1)
		}
		cmd := make([]byte, size)
		copy(cmd, hdr[:])
		if _, err := io.ReadFull(client, cmd[10:]); err != nil {
			return
		}
		if _, err := server.Write(cmd); err != nil {
			return
		}
	}
}

// daProtectedAKHandle holds the DA-protected AK of LoadDAProtectedAK.
const daProtectedAKHandle = tpmutil.Handle(0x81000100)

// LoadDAProtectedAK is a vtpm.IssuerConfig.LoadAK for go-tpm-tools' own AK (AKTemplateRSA,
// without noDA): the key this project's AKs were before they had noDA, and the kind of key a
// platform may provide (GCE's AK template lacks noDA). Quoting with it is an authorization of
// a DA-protected object.
func LoadDAProtectedAK(rw io.ReadWriter) (*client.Key, error) {
	return client.NewCachedKey(rw, tpm2.HandleOwner, client.AKTemplateRSA(), daProtectedAKHandle)
}

// LockOut puts tpm into dictionary-attack lockout the way a password guesser does: with DA
// parameters made tiny (two failures allowed, one forgiven every recovery, which must be
// whole seconds), two wrong passwords for a DA-protected key. It needs the lockout
// authorization empty, as on a fresh TPM.
func LockOut(t testing.TB, tpm *vtpm.TPM, recovery time.Duration) {
	t.Helper()
	lockoutAuth := tpm2.AuthCommand{Session: tpm2.HandlePasswordSession, Attributes: tpm2.AttrContinueSession, Auth: tpm2.EmptyAuth}
	require.NoError(t, tpm.With(func(rw io.ReadWriter) error {
		if err := tpm2.DictionaryAttackParameters(rw, lockoutAuth, 2, uint32(recovery/time.Second), 1); err != nil {
			return fmt.Errorf("setting DA parameters: %w", err)
		}
		tmpl := tpm2.Public{
			Type: tpm2.AlgECC, NameAlg: tpm2.AlgSHA256,
			Attributes: tpm2.FlagSign | tpm2.FlagFixedTPM | tpm2.FlagFixedParent | tpm2.FlagSensitiveDataOrigin | tpm2.FlagUserWithAuth,
			ECCParameters: &tpm2.ECCParams{
				Sign:    &tpm2.SigScheme{Alg: tpm2.AlgECDSA, Hash: tpm2.AlgSHA256},
				CurveID: tpm2.CurveNISTP256,
			},
		}
		key, _, err := tpm2.CreatePrimary(rw, tpm2.HandleOwner, tpm2.PCRSelection{}, "", "the password", tmpl)
		if err != nil {
			return fmt.Errorf("creating a key with a password: %w", err)
		}
		defer tpm2.FlushContext(rw, key)
		digest := sha256.Sum256([]byte("anything"))
		for range 2 {
			if _, err := tpm2.Sign(rw, key, "a guess", digest[:], nil, nil); err == nil {
				return errors.New("the TPM signed with a wrong password")
			}
		}
		return nil
	}))
	da, err := tpm.DAState()
	require.NoError(t, err)
	require.True(t, da.LockedOut(), "two wrong passwords lock the TPM out: %+v", da)
}

// BootImage boots tpm as a node image does (eventlogtest.Image(component): measured into
// the PCRs and logged) and returns the image's reference values (every image register of
// variant v, as the TPM now holds them) and the event log. It needs no testing.TB, so
// examples and other modules' tests use it.
func BootImage(tpm *vtpm.TPM, v variant.Variant, component string) (measurements.M, []byte, error) {
	log, err := eventlogtest.BootLog(tpm, eventlogtest.Image(component))
	if err != nil {
		return nil, nil, err
	}
	pcrs, err := tpm.ReadPCRs()
	if err != nil {
		return nil, nil, err
	}
	return measurementstest.FromRegisters(v, pcrs), log, nil
}

// AKID returns the signer ID a validator reports for the AK whose public area is akPublic
// (vtpm.AKID of its key).
func AKID(t testing.TB, akPublic []byte) string {
	t.Helper()
	pub, err := tpm2.DecodePublic(akPublic)
	require.NoError(t, err)
	key, err := pub.Key()
	require.NoError(t, err)
	id, err := vtpm.AKID(key)
	require.NoError(t, err)
	return id
}
