package local_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-eventlog/tcg"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/attestation/akca"
	"github.com/openconstellation/constellation/internal/attestation/softfirmware"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider/local"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/eventlog"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/vtpmtest"
)

// logImage is a node image with two components in one PCR (order matters) and one in another.
func logImage() []softfirmware.Component {
	return []softfirmware.Component{
		softfirmware.BytesComponent("bootstrapper", local.PCRBootstrapper, []byte("bootstrapper v1")),
		softfirmware.BytesComponent("kubelet", local.PCRBootstrapper, []byte("kubelet v1.34.4")),
		softfirmware.BytesComponent("node-config", local.PCRNodeConfig, []byte(`{"k8s":"v1.34.4"}`)),
	}
}

// buildLog writes the log MeasureLogged would write for image, without a TPM: the forger's
// tool.
func buildLog(t *testing.T, image []softfirmware.Component) []byte {
	log, err := softfirmware.ImageEventLog(image)
	require.NoError(t, err)
	return log
}

// TestMeasuredBootLogReplays: the log of a measured boot replays against the PCRs the boot
// left in the TPM (also after the cluster-ID marker was extended into PCR 15 without an
// event), names the components in order, and any change to what it says was measured where
// makes it fail to replay.
func TestMeasuredBootLogReplays(t *testing.T) {
	image := logImage()
	tpm := vtpmtest.Simulator(t)
	raw, err := softfirmware.MeasureLogged(tpm, image)
	require.NoError(t, err)
	marker := sha256.Sum256([]byte("cluster id"))
	require.NoError(t, tpm.ExtendPCR(local.PCRClusterID, marker[:]))
	pcrs, err := tpm.ReadPCRs()
	require.NoError(t, err)

	assert.Equal(t, buildLog(t, image), raw, "the offline log is the measured one")
	log, err := eventlog.Replay(raw, pcrs)
	require.NoError(t, err)
	var got []string
	for _, e := range log.Events() {
		assert.Equal(t, tcg.Ipl, e.Type)
		got = append(got, string(e.Data))
	}
	assert.Equal(t, []string{"bootstrapper", "kubelet", "node-config"}, got)

	flipDigest := func(i int) []byte {
		out := bytes.Clone(raw)
		at := bytes.Index(out, image[i].Digest[:])
		require.GreaterOrEqual(t, at, 0)
		out[at] ^= 1
		return out
	}
	with := func(change func(image []softfirmware.Component) []softfirmware.Component) []byte {
		return buildLog(t, change(logImage()))
	}
	testCases := map[string]struct {
		log     []byte
		wantMsg string // empty: replays
	}{
		"the log as written":                 {log: raw},
		"a byte of the first digest flipped": {log: flipDigest(0), wantMsg: "PCR 11"},
		"a byte of the last digest flipped":  {log: flipDigest(2), wantMsg: "PCR 12"},
		"another bootstrapper claimed": {log: with(func(im []softfirmware.Component) []softfirmware.Component {
			im[0] = softfirmware.BytesComponent("bootstrapper", local.PCRBootstrapper, []byte("bootstrapper v2"))
			return im
		}), wantMsg: "PCR 11"},
		"a component left out": {log: with(func(im []softfirmware.Component) []softfirmware.Component {
			return append(im[:1:1], im[2:]...)
		}), wantMsg: "PCR 11"},
		"a component added": {log: with(func(im []softfirmware.Component) []softfirmware.Component {
			return append(im, softfirmware.BytesComponent("debug shell", local.PCRNodeConfig, []byte("sh")))
		}), wantMsg: "PCR 12"},
		"two components swapped": {log: with(func(im []softfirmware.Component) []softfirmware.Component {
			im[0], im[1] = im[1], im[0]
			return im
		}), wantMsg: "PCR 11"},
		"a component moved to PCR 24": {log: func() []byte {
			b := eventlog.NewBuilder()
			b.AddDigest(24, tcg.Ipl, image[0].Digest, []byte("out of range"))
			return b.Bytes()
		}(), wantMsg: "PCR 24"},
		"a component moved to another PCR": {log: with(func(im []softfirmware.Component) []softfirmware.Component {
			im[2].PCR = 13
			return im
		}), wantMsg: "PCR"},
		// EV_IPL data is a description, not what was hashed: a renamed component still
		// replays, and verifiers must not trust the name (eventlog.Replay's dataBoundTypes).
		"a component renamed": {log: with(func(im []softfirmware.Component) []softfirmware.Component {
			im[0].Name = "anything"
			return im
		})},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			_, err := eventlog.Replay(tc.log, pcrs)
			if tc.wantMsg == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorIs(t, err, attestation.ErrMalformed)
			assert.ErrorContains(t, err, tc.wantMsg)
		})
	}
}

// TestMeasuredBootLogInEvidence: a node's evidence, issued as nodeboot issues it (choose, the
// event log read from the file the provider wrote), passes the qemu-vtpm validator the
// cluster uses; evidence without the log, or with one event of it changed, does not.
func TestMeasuredBootLogInEvidence(t *testing.T) {
	if testing.Short() {
		t.Skip("runs swtpm")
	}
	image := logImage()
	// The provider's side of a boot (cluster.bootLocked): measure, certify, lock, close.
	proc := vtpmtest.SwtpmProcess(t)
	tpm, err := proc.Open(context.Background())
	require.NoError(t, err)
	raw, err := softfirmware.MeasureLogged(tpm, image)
	require.NoError(t, err)
	ca, err := akca.New("provider", time.Now(), time.Hour)
	require.NoError(t, err)
	require.NoError(t, softfirmware.CertifyAK(tpm, ca, "node-0", metadata.ControlPlane, time.Now()))
	require.NoError(t, softfirmware.LockPlatform(tpm))
	require.NoError(t, tpm.Close())
	path := filepath.Join(t.TempDir(), local.EventLogFile)
	require.NoError(t, local.WriteEventLog(path, raw))

	caPEM, _, err := ca.PEM()
	require.NoError(t, err)
	val, err := choose.NewValidator(choose.Reference{Variant: local.Variant, Values: choose.Values{
		Measurements: measurements.ReferenceSets{{Name: "image", Measurements: softfirmware.ExpectedPCRs(image)}},
		AKRoots:      string(caPEM),
	}}, choose.Options{})
	require.NoError(t, err)
	nonce := bytes.Repeat([]byte{7}, 32)
	// The node's side (nodeboot): the TPM opened per use, the log read from the file.
	issue := func(t *testing.T, eventLog func() ([]byte, error)) []byte {
		iss, err := choose.NewIssuer(context.Background(), local.Variant, choose.IssuerEnv{TPM: vtpm.OpenAddr(proc.Addr()), AK: vtpm.AKRSA, EventLog: eventLog})
		require.NoError(t, err)
		ev, err := iss.Issue(context.Background(), attestation.PurposeVerify, nonce)
		require.NoError(t, err)
		return ev
	}

	t.Run("genuine log", func(t *testing.T) {
		ev := issue(t, vtpm.ReadEventLog(path))
		_, err := val.Validate(context.Background(), ev, attestation.PurposeVerify, nonce)
		assert.NoError(t, err)
	})
	// Every producer of qemu-vtpm evidence sends the log (nodeboot, the join and verification
	// services), so the validator requires it: evidence without it hides what was measured.
	t.Run("no log", func(t *testing.T) {
		ev := issue(t, nil)
		_, err := val.Validate(context.Background(), ev, attestation.PurposeVerify, nonce)
		assert.ErrorIs(t, err, attestation.ErrMalformed)
		assert.ErrorContains(t, err, "no event log")
	})
	t.Run("one event changed", func(t *testing.T) {
		bad := bytes.Clone(raw)
		bad[bytes.Index(bad, image[2].Digest[:])] ^= 1
		require.NoError(t, local.WriteEventLog(path, bad))
		t.Cleanup(func() { require.NoError(t, local.WriteEventLog(path, raw)) })
		ev := issue(t, vtpm.ReadEventLog(path))
		_, err := val.Validate(context.Background(), ev, attestation.PurposeVerify, nonce)
		assert.ErrorIs(t, err, attestation.ErrMalformed)
		assert.ErrorContains(t, err, "PCR 12")
	})
}

// TestWriteEventLog: the provider's log file is replaced whole at every boot and readable by
// the node.
func TestWriteEventLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), local.EventLogFile)
	require.NoError(t, local.WriteEventLog(path, []byte("first boot, a longer log")))
	require.NoError(t, local.WriteEventLog(path, []byte("second boot")))
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "second boot", string(got))
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o644), fi.Mode().Perm())
	entries, err := os.ReadDir(filepath.Dir(path))
	require.NoError(t, err)
	assert.Len(t, entries, 1, "no temporary file left behind")
}

// TestImageEventLogRange: a component for a PCR the TPM does not have is refused before
// anything is measured.
func TestImageEventLogRange(t *testing.T) {
	for _, pcr := range []int{-1, eventlog.NumPCRs} {
		_, err := softfirmware.ImageEventLog([]softfirmware.Component{{Name: "x", PCR: pcr}})
		assert.ErrorContains(t, err, "out of range")
	}
}
