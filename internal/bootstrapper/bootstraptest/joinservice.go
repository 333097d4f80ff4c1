package bootstraptest

import (
	"context"
	"crypto/sha256"
	"log/slog"
	"net"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/openconstellation/constellation/internal/attestation/akca"
	"github.com/openconstellation/constellation/internal/attestation/softfirmware"
	"github.com/openconstellation/constellation/internal/diskowner"
	"github.com/openconstellation/constellation/internal/handshakelimit"
	"github.com/openconstellation/constellation/internal/joinservice"
	"github.com/openconstellation/constellation/internal/kms"
	"github.com/openconstellation/constellation/internal/kube/kubetest"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	"github.com/openconstellation/constellation/pkg/attestation/qemu"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
)

// Cluster is a running join service of an initialized cluster: its control-plane node (a
// real swtpm, measured from Image, PCR 15 extended with the cluster ID) and a real API server.
type Cluster struct {
	Master          kms.MasterSecret
	MeasurementSalt []byte
	ClusterID       []byte
	Kube            *kubetest.Cluster
	// Addr is the join service's host:port.
	Addr string
	// Directory is what the platform knows of nodes (by the name in their AK certificate).
	Directory joinservice.StaticDirectory
	// Server stops serving when Stop is called.
	Server *handshakelimit.GRPCServer
}

// ClusterOptions tune StartJoinService. Besides the genuine service they make the impostors
// a joining node must refuse.
type ClusterOptions struct {
	// WrongMarker extends the service node's PCR 15 with another cluster's ID.
	WrongMarker bool
	// NoMarker leaves the service node's PCR 15 zero: a node never initialized.
	NoMarker bool
	// Service describes the platform of the service's node (default: a control plane booted
	// from Image, certified by the cluster's CA).
	Service NodeOptions
	// ServiceCA, when set, certifies the service's node instead of the cluster's CA.
	ServiceCA *akca.CA
	// SoftwareAK makes the service sign its evidence with a software key instead of its
	// TPM, showing Image's PCR values and its cluster's marker: an impostor without a TPM.
	SoftwareAK bool
}

// StartJoinService starts a join service for a new cluster on kube, admitting nodes booted
// from Image whose AKs ca certified; nodes must be listed in the returned Directory.
func StartJoinService(t testing.TB, ca *akca.CA, kube *kubetest.Cluster, opts ClusterOptions) *Cluster {
	t.Helper()
	master, err := kms.NewMasterSecret()
	require.NoError(t, err)
	c := &Cluster{Master: master, MeasurementSalt: []byte(rand.String(32)), Kube: kube, Directory: joinservice.StaticDirectory{}}
	ms, err := master.MeasurementSecret()
	require.NoError(t, err)
	c.ClusterID, err = kms.ClusterID(ms, c.MeasurementSalt)
	require.NoError(t, err)

	// Init creates the namespace of the disk-owner records before the join service runs.
	require.NoError(t, diskowner.EnsureNamespace(context.Background(), kube.Admin))
	serviceCA := ca
	if opts.ServiceCA != nil {
		serviceCA = opts.ServiceCA
	}
	service := NewNodeWith(t, "control-plane-service", serviceCA, opts.Service)
	marker := sha256.Sum256(c.ClusterID)
	if opts.WrongMarker {
		marker = sha256.Sum256([]byte("another cluster"))
	}
	if !opts.NoMarker {
		require.NoError(t, service.TPM.ExtendPCR(int(clusterIDRegister), marker[:]))
	}
	var issuer attestation.Issuer
	if opts.SoftwareAK {
		pcrs := map[uint32][]byte{}
		for i, m := range softfirmware.ExpectedPCRs(Image) {
			pcrs[i] = m.Expected
		}
		pcrs[clusterIDRegister] = softfirmware.Variant.ClusterIDMarker(c.ClusterID)
		soft := NewSoftwareIssuer(t, pcrs)
		soft.EventLog, err = softfirmware.ImageEventLog(Image)
		require.NoError(t, err)
		issuer = soft
	} else {
		tpmIssuer, err := vtpm.NewIssuer(service.TPM, qemu.VTPMIssuerConfig(qemu.IssuerConfig{AK: vtpm.AKECC, EventLog: service.ReadEventLog}))
		require.NoError(t, err)
		t.Cleanup(func() { tpmIssuer.Close() })
		issuer = tpmIssuer
	}
	active, err := measurements.NewActive(qemu.Variant, measurements.ReferenceSets{{Name: "test-image", Measurements: softfirmware.ExpectedPCRs(Image)}})
	require.NoError(t, err)
	// Built as cmd/joinservice builds it: through the variant registry.
	caPEM, _, err := ca.PEM()
	require.NoError(t, err)
	validator, err := choose.NewValidator(choose.Reference{Variant: qemu.Variant, Values: choose.Values{AKRoots: string(caPEM)}}, choose.Options{Active: active})
	require.NoError(t, err)
	svc, err := joinservice.New(joinservice.Config{
		Issuer: issuer, Validator: validator, Active: active,
		Keys:            masterKeys{master},
		MeasurementSalt: c.MeasurementSalt,
		Kube:            kube.Admin, PKIDir: kube.PKIDir,
		Platform:          joinservice.CertifiedNames{Directory: c.Directory},
		APIServerEndpoint: kube.Host, KubernetesVersion: kubetest.Version,
		Log: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	// Served as cmd/joinservice serves it.
	c.Server = svc.NewGRPCServer()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = c.Server.Serve(ln) }()
	t.Cleanup(c.Server.Stop)
	c.Addr = ln.Addr().String()
	return c
}

// Admit lists a node in the platform's directory.
func (c *Cluster) Admit(name string, ip netip.Addr, controlPlane bool) {
	c.Directory[name] = joinservice.Node{Name: name, Addresses: []netip.Addr{ip}, ControlPlane: controlPlane}
}

// masterKeys derives keys directly from the master secret, as the key service does.
type masterKeys struct{ master kms.MasterSecret }

func (k masterKeys) DataKey(_ context.Context, id string, length int) ([]byte, error) {
	return k.master.DeriveKey(id, length)
}

// clusterIDRegister is the register of the local provider's variant that carries the
// cluster-ID marker.
var clusterIDRegister, _ = softfirmware.Variant.ClusterIDRegister()
