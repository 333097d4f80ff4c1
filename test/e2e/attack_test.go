package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/openconstellation/constellation/api/join/joinpb"
	"github.com/openconstellation/constellation/internal/attestation/akca"
	"github.com/openconstellation/constellation/internal/attestation/softfirmware"
	"github.com/openconstellation/constellation/internal/deploy"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/pki"
	"github.com/openconstellation/constellation/internal/provider/local"
	"github.com/openconstellation/constellation/internal/provider/local/cluster"
	"github.com/openconstellation/constellation/internal/provider/local/sandbox"
	"github.com/openconstellation/constellation/internal/statedisk"
	"github.com/openconstellation/constellation/pkg/api/verify/verifypb"
	"github.com/openconstellation/constellation/pkg/atls"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/qemu"
	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm/swtpm"
)

// TestAttacks attacks a running local cluster (one control plane, one worker) from the
// attacker positions of docs/threat-model.md, against the shipped binaries and services:
// anyone who reaches node ports (from the cluster's bridge), and a compromised worker (root on
// worker-0: its network namespace and its TPM, with the AK the platform certified for it).
// Every attack must fail, name its reason, and leave the cluster working.
func TestAttacks(t *testing.T) {
	bin, _ := buildBinaries(t)
	ws := t.TempDir()
	miniUp(t, bin, ws, "--workers", "1")
	st, err := cluster.ReadStatus(filepath.Join(ws, "mini"))
	require.NoError(t, err)
	cp, worker := st.Nodes[0], st.Nodes[1]
	require.Equal(t, "control-plane-0", cp.Name)
	require.Equal(t, "worker-0", worker.Name)
	kubeconfig := filepath.Join(ws, "constellation-admin.conf")

	outside := attackerPosition{ns: sandbox.NSPath(sandbox.Network{ID: st.NetworkID}.BridgeNS())}
	onWorker := attackerPosition{ns: worker.NetNS}
	joinService := net.JoinHostPort(cp.IP, fmt.Sprint(deploy.JoinServicePort))
	nodeDir := func(name string) string { return filepath.Join(ws, "mini", "nodes", name) }
	diskUUID := func(name string) string {
		id, err := (&statedisk.Gocryptfs{Dir: filepath.Join(nodeDir(name), "state")}).UUID()
		require.NoError(t, err)
		return id
	}
	// The compromised worker quotes with its own TPM and the AK certified for worker-0.
	workerIssuer := func(t *testing.T) attestation.Issuer {
		iss, err := vtpm.NewPerUseIssuer(context.Background(), vtpm.OpenAddr("unix:"+filepath.Join(nodeDir(worker.Name), "tpm", "tpm.sock")),
			vtpm.IssuerConfig{Variant: qemu.Variant, AK: vtpm.AKRSA, EventLog: vtpm.ReadEventLog(filepath.Join(nodeDir(worker.Name), "tpm", local.EventLogFile))})
		require.NoError(t, err)
		return iss
	}

	t.Run("relay: the control plane's verification service attests the attacker's join connection", func(t *testing.T) {
		// The attacker has no TPM. It asks control-plane-0's verification service (which quotes
		// any caller nonce) to quote the binding data of its own attested connection to the join
		// service, and presents that quote: genuine, fresh, certified for control-plane-0.
		verifier, err := grpc.NewClient("passthrough:///"+net.JoinHostPort(cp.IP, fmt.Sprint(deploy.VerificationGRPCPort)),
			grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(outside.dial))
		require.NoError(t, err)
		defer verifier.Close()
		var relayed int
		relay := relayIssuer{fn: func(ctx context.Context, data []byte) ([]byte, error) {
			relayed++
			resp, err := verifypb.NewVerificationServiceClient(verifier).GetAttestation(ctx, &verifypb.GetAttestationRequest{Nonce: data})
			if err != nil {
				return nil, err
			}
			return resp.Evidence, nil
		}}
		_, err = outside.joinTicket(t, joinService, relay, &joinpb.IssueJoinTicketRequest{
			DiskUuid: uuid.NewString(), IsControlPlane: true, CertificateRequest: kubeletCSR(t, cp.Name, cp.IP), ClientCertificateRequest: clientCSR(t, cp.Name),
		})
		require.Error(t, err, "no ticket for relayed evidence")
		assert.Equal(t, 1, relayed, "the verification service did quote for the attacker")
		assert.Contains(t, err.Error(), "evidence not bound to this nonce")
		assert.Contains(t, err.Error(), "another purpose")
	})

	t.Run("replay: evidence of one attested connection presented on another", func(t *testing.T) {
		iss := workerIssuer(t)
		var recorded []byte
		recorder := relayIssuer{fn: func(ctx context.Context, data []byte) ([]byte, error) {
			ev, err := iss.Issue(ctx, attestation.PurposeATLSClient, data)
			recorded = ev
			return ev, err
		}}
		// The first connection is genuine; the ticket request is refused for other reasons
		// (an invalid disk id), the handshake succeeded.
		_, err := onWorker.joinTicket(t, joinService, recorder, &joinpb.IssueJoinTicketRequest{DiskUuid: "not-a-uuid"})
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
		require.NotEmpty(t, recorded)
		replay := relayIssuer{fn: func(context.Context, []byte) ([]byte, error) { return recorded, nil }}
		_, err = onWorker.joinTicket(t, joinService, replay, &joinpb.IssueJoinTicketRequest{DiskUuid: diskUUID(worker.Name)})
		require.Error(t, err)
		assert.Contains(t, err.Error(), "evidence not bound to this nonce")
	})

	t.Run("compromised worker: rejoin ticket for the control plane's disk", func(t *testing.T) {
		resp, err := onWorker.rejoinTicket(t, joinService, workerIssuer(t), diskUUID(cp.Name), worker.Name)
		require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
		assert.Nil(t, resp, "no disk key")
	})

	t.Run("compromised worker: join ticket for the control plane's disk", func(t *testing.T) {
		resp, err := onWorker.joinTicket(t, joinService, workerIssuer(t), &joinpb.IssueJoinTicketRequest{
			DiskUuid: diskUUID(cp.Name), CertificateRequest: kubeletCSR(t, worker.Name, worker.IP), ClientCertificateRequest: clientCSR(t, worker.Name),
		})
		require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
		assert.Nil(t, resp, "no disk key")
	})

	t.Run("compromised worker: join ticket as a control plane", func(t *testing.T) {
		resp, err := onWorker.joinTicket(t, joinService, workerIssuer(t), &joinpb.IssueJoinTicketRequest{
			DiskUuid: uuid.NewString(), IsControlPlane: true, CertificateRequest: kubeletCSR(t, worker.Name, worker.IP), ClientCertificateRequest: clientCSR(t, worker.Name),
		})
		require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
		assert.Contains(t, err.Error(), "worker")
		assert.Nil(t, resp, "no CA keys")
	})

	t.Run("compromised worker: kubelet certificate for another node", func(t *testing.T) {
		for what, req := range map[string]*joinpb.IssueJoinTicketRequest{
			"serving": {DiskUuid: diskUUID(worker.Name), CertificateRequest: kubeletCSR(t, cp.Name, cp.IP), ClientCertificateRequest: clientCSR(t, worker.Name)},
			"client":  {DiskUuid: diskUUID(worker.Name), CertificateRequest: kubeletCSR(t, worker.Name, worker.IP), ClientCertificateRequest: clientCSR(t, cp.Name)},
		} {
			resp, err := onWorker.joinTicket(t, joinService, workerIssuer(t), req)
			require.Equal(t, codes.PermissionDenied, status.Code(err), "%s: %v", what, err)
			assert.Contains(t, err.Error(), `common name "system:node:control-plane-0", want "system:node:worker-0"`, what)
			assert.Nil(t, resp, what)
		}
	})

	t.Run("compromised worker: its own ticket's credentials get no other name approved", func(t *testing.T) {
		// The worker asks for its own join ticket again (allowed: its own disk). The ticket
		// names worker-0 alone and carries no bootstrap token; none exists in the cluster.
		// With the ticket's client certificate, and with the kubelet's current one read from
		// the node, it asks kube-controller-manager for other identities: nothing is ever
		// approved, while its request for its own name is (so the approver runs).
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
			Subject: pkix.Name{CommonName: "system:node:" + worker.Name, Organization: []string{"system:nodes"}},
		}, key)
		require.NoError(t, err)
		resp, err := onWorker.joinTicket(t, joinService, workerIssuer(t), &joinpb.IssueJoinTicketRequest{
			DiskUuid: diskUUID(worker.Name), CertificateRequest: kubeletCSR(t, worker.Name, worker.IP), ClientCertificateRequest: der,
		})
		require.NoError(t, err)
		keyPEM, err := pki.EncodeKey(key)
		require.NoError(t, err)
		admin := adminClient(t, kubeconfig)
		tokens, err := admin.CoreV1().Secrets("kube-system").List(t.Context(), metav1.ListOptions{FieldSelector: "type=bootstrap.kubernetes.io/token"})
		require.NoError(t, err)
		assert.Empty(t, tokens.Items, "a bootstrap token exists in the cluster")

		for name, creds := range map[string]nodeCredential{
			"the ticket's client certificate":          {cert: resp.KubeletClientCert, key: keyPEM},
			"the kubelet's current client certificate": kubeletCredential(t, ws, worker.Name),
		} {
			t.Run(name, func(t *testing.T) {
				asWorker := creds.client(t, kubeconfig)
				assert.Equal(t, "system:node:"+worker.Name, whoami(t, asWorker))
				assertNoOtherIdentity(t, admin, asWorker, worker.Name, cp.Name)
			})
		}
	})

	t.Run("node of another cluster: same image, AK certified by another provider", func(t *testing.T) {
		// Not t.TempDir: the subtest's name has a comma, which swtpm's option syntax splits on.
		dir, err := os.MkdirTemp("", "attack-tpm-")
		require.NoError(t, err)
		t.Cleanup(func() { os.RemoveAll(dir) })
		proc, err := swtpm.Start(context.Background(), swtpm.Options{StateDir: dir})
		require.NoError(t, err)
		t.Cleanup(func() { _ = proc.Stop() })
		tpm, err := proc.Open(context.Background())
		require.NoError(t, err)
		image, err := local.ImageComponents(worker.ImageDir)
		require.NoError(t, err)
		bootLog, err := softfirmware.MeasureLogged(tpm, image)
		require.NoError(t, err)
		otherCA, err := akca.New("another cluster's AK CA", time.Now(), time.Hour)
		require.NoError(t, err)
		require.NoError(t, softfirmware.CertifyAK(tpm, otherCA, worker.Name, metadata.Worker, time.Now()))
		iss, err := vtpm.NewIssuer(tpm, vtpm.IssuerConfig{Variant: variant.QEMUVTPM, EventLog: func() ([]byte, error) { return bootLog, nil }})
		require.NoError(t, err)
		_, err = outside.joinTicket(t, joinService, iss, &joinpb.IssueJoinTicketRequest{
			DiskUuid: uuid.NewString(), CertificateRequest: kubeletCSR(t, worker.Name, worker.IP), ClientCertificateRequest: clientCSR(t, worker.Name),
		})
		require.Error(t, err)
		assert.Contains(t, err.Error(), "evidence signer not trusted")
	})

	t.Run("verify: a node's address answering with another node's evidence", func(t *testing.T) {
		// As if worker-0 relayed the control plane's verification service.
		out, err := exec.Command(bin, "verify", "-C", ws, "--node", worker.Name,
			"--endpoint", net.JoinHostPort(cp.IP, fmt.Sprint(deploy.VerificationGRPCPort))).CombinedOutput()
		require.Error(t, err, "%s", out)
		assert.Contains(t, string(out), "FAIL  worker-0")
		assert.Contains(t, string(out), `certified for "control-plane-0", not "worker-0"`)
	})

	t.Run("garbage flood while the worker rejoins", func(t *testing.T) {
		// 500 connections that send garbage from outside; meanwhile the genuine worker gets its
		// rejoin ticket (its own disk), and the join service's log stays short.
		const flood = 500
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range flood / 4 {
					c, err := outside.dial(context.Background(), joinService)
					if err != nil {
						continue
					}
					_, _ = c.Write([]byte("GET / HTTP/1.0\r\n\r\n\x16\x03\x01garbage"))
					_ = c.Close()
				}
			}()
		}
		resp, err := onWorker.rejoinTicket(t, joinService, workerIssuer(t), diskUUID(worker.Name), worker.Name)
		wg.Wait()
		require.NoError(t, err, "the genuine worker rejoins during the flood")
		assert.Len(t, resp.StateDiskKey, 32)

		logs := kubectl(t, kubeconfig, "-n", "kube-system", "logs", "-l", "app.kubernetes.io/name="+deploy.JoinService, "--tail=-1")
		fromOutside := regexp.MustCompile(`"msg":"admission rejected".*"peer":"` + regexp.QuoteMeta(sandbox.BridgeAddr.String()) + `"`)
		lines := 0
		for _, l := range strings.Split(logs, "\n") {
			if fromOutside.MatchString(l) {
				lines++
			}
		}
		assert.Less(t, lines, 20, "rejections are logged rate-limited, not one line each")
	})

	// The cluster still works: both nodes Ready and verified.
	assert.ElementsMatch(t, []string{cp.Name, worker.Name}, readyNodes(t, kubeconfig))
	out, err := exec.Command(bin, "verify", "-C", ws, "-o", "json").CombinedOutput()
	require.NoError(t, err, "%s", out)
	var reports []struct{ Verified bool }
	require.NoError(t, json.Unmarshal(out, &reports))
	assert.Len(t, reports, 2)
}

// attackerPosition is a network namespace the attacker sends from.
type attackerPosition struct{ ns string }

func (p attackerPosition) dial(ctx context.Context, addr string) (net.Conn, error) {
	return sandbox.DialContext(ctx, p.ns, "tcp", addr)
}

// joinClient connects to the join service over the attested channel as a client that attests
// with iss (and does not check the service: the attacker does not care). The caller closes
// the connection after one call: gRPC would otherwise reconnect in the background, spending
// the peer's handshake budget at the join service.
func (p attackerPosition) joinClient(t *testing.T, addr string, iss attestation.Issuer) (joinpb.JoinServiceClient, func()) {
	t.Helper()
	creds, err := atls.NewCredentials(atls.Config{Issuer: iss})
	require.NoError(t, err)
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(creds), grpc.WithContextDialer(p.dial))
	require.NoError(t, err)
	return joinpb.NewJoinServiceClient(conn), func() { conn.Close() }
}

func (p attackerPosition) joinTicket(t *testing.T, addr string, iss attestation.Issuer, req *joinpb.IssueJoinTicketRequest) (*joinpb.IssueJoinTicketResponse, error) {
	return withinRateLimit(t, func(ctx context.Context) (*joinpb.IssueJoinTicketResponse, error) {
		client, done := p.joinClient(t, addr, iss)
		defer done()
		return client.IssueJoinTicket(ctx, req)
	})
}

func (p attackerPosition) rejoinTicket(t *testing.T, addr string, iss attestation.Issuer, disk, worker string) (*joinpb.IssueRejoinTicketResponse, error) {
	return withinRateLimit(t, func(ctx context.Context) (*joinpb.IssueRejoinTicketResponse, error) {
		client, done := p.joinClient(t, addr, iss)
		defer done()
		return client.IssueRejoinTicket(ctx, &joinpb.IssueRejoinTicketRequest{DiskUuid: disk, ClientCertificateRequest: clientCSR(t, worker)})
	})
}

// withinRateLimit calls call until the join service's per-peer handshake limit lets it
// through (the attacks come from two addresses, faster than the 1/s the service allows each),
// within a deadline, and returns the first answer that is not a rate-limit refusal.
func withinRateLimit[R any](t *testing.T, call func(ctx context.Context) (R, error)) (R, error) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		resp, err := call(ctx)
		cancel()
		limited := status.Code(err) == codes.Unavailable &&
			(strings.Contains(err.Error(), "rate limited") || strings.Contains(err.Error(), "in progress"))
		if !limited || time.Now().After(deadline) {
			return resp, err
		}
		time.Sleep(time.Second) // the bucket refills at 1/s
	}
}

// relayIssuer answers the attested channel's request for evidence with whatever fn returns
// for the channel's binding data, whatever the purpose.
type relayIssuer struct {
	fn func(ctx context.Context, data []byte) ([]byte, error)
}

func (relayIssuer) Variant() variant.Variant { return qemu.Variant }
func (r relayIssuer) Issue(ctx context.Context, _ attestation.Purpose, data []byte) ([]byte, error) {
	return r.fn(ctx, data)
}

// clientCSR is a kubelet client certificate request for node, with a fresh key.
func clientCSR(t *testing.T, node string) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}},
	}, key)
	require.NoError(t, err)
	return der
}

// kubeletCSR is a kubelet serving certificate request for node at ip, with a fresh key.
func kubeletCSR(t *testing.T, node, ip string) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject:     pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}},
		DNSNames:    []string{node},
		IPAddresses: []net.IP{netip.MustParseAddr(ip).AsSlice()},
	}, key)
	require.NoError(t, err)
	return der
}
