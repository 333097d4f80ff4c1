package csidriver_test

import (
	"context"
	"crypto/rand"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/csidriver"
	"github.com/openconstellation/constellation/internal/csidriver/unlock"
	"github.com/openconstellation/constellation/internal/testtier"
)

// sanityIDs gives csi-sanity volume ids of the driver's form (so "does not exist" is tested
// against the platform, not only the id check) and node ids the platform does not know.
type sanityIDs struct{}

func (sanityIDs) GenerateUniqueValidVolumeID() string { return csidriver.IDFor(rand.Text()) }
func (sanityIDs) GenerateInvalidVolumeID() string     { return "not-a-volume-id" }
func (sanityIDs) GenerateUniqueValidNodeID() string   { return "node-" + rand.Text() }
func (sanityIDs) GenerateInvalidNodeID() string       { return "" }

// TestSanity runs the Kubernetes CSI sanity suite (kubernetes-csi/csi-test) against the
// driver's controller and node services, served on unix sockets as cmd/csidriver and the
// node program serve them, with the real gocryptfs unlocker. Only the platform is a fake:
// an in-memory Backing whose volumes are sparse files, as the local provider keeps them.
func TestSanity(t *testing.T) {
	testtier.Integration(t, "csi-sanity with losetup, mkfs.ext4 and gocryptfs as root")
	start := time.Now()
	dir := t.TempDir()
	volumes := filepath.Join(dir, "volumes")
	require.NoError(t, os.Mkdir(volumes, 0o700))
	b := newMemBacking(volumes, "node-1")
	b.sparse = true
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	ctx, cancel := context.WithCancel(context.Background())
	controllerSock := filepath.Join(dir, "controller", "csi.sock")
	pluginDir, regDir := filepath.Join(dir, "plugins"), filepath.Join(dir, "plugins_registry")
	served := make(chan error, 2)
	go func() {
		served <- csidriver.ServeController(ctx, "unix://"+controllerSock, csidriver.NewController(b, log))
	}()
	node := csidriver.NewNode(csidriver.NodeConfig{
		NodeName:  "node-1",
		KeySource: &keys{},
		Devices:   devices{b: b, node: "node-1"},
		Unlocker:  &unlock.Gocryptfs{WorkDir: filepath.Join(dir, "work")},
		Logger:    log,
	})
	go func() { served <- csidriver.ServeNode(ctx, pluginDir, regDir, node) }()
	t.Cleanup(func() {
		cancel()
		for range 2 {
			require.NoError(t, <-served)
		}
	})
	waitForSocket(t, controllerSock)
	waitForSocket(t, csidriver.NodeSocket(pluginDir))

	cfg := sanity.NewTestConfig()
	cfg.Address = csidriver.NodeSocket(pluginDir)
	cfg.ControllerAddress = controllerSock
	cfg.TargetPath = filepath.Join(dir, "target")
	cfg.StagingPath = filepath.Join(dir, "staging")
	cfg.TestVolumeSize = 32 << 20
	cfg.TestVolumeExpandSize = 64 << 20
	cfg.IDGen = sanityIDs{}
	sanity.Test(t, cfg)
	t.Logf("csi-sanity took %s", time.Since(start).Round(time.Second))
}
