package verify

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/openconstellation/constellation/pkg/api/verify/verifypb"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/untrusted"
	"github.com/openconstellation/constellation/pkg/untrusted/untrustedgrpc"
)

// DefaultTimeout bounds a verification whose context has no deadline.
const DefaultTimeout = 30 * time.Second

// NonceSize is the size of the fresh nonce the client sends.
const NonceSize = 32

// ErrClusterIDMismatch: the node's evidence verified, but its PCR 15 does not carry the
// expected cluster's marker (it belongs to another cluster, or is not initialized).
var ErrClusterIDMismatch = errors.New("node does not carry this cluster's marker")

// ErrWrongNode: the node's evidence verified, but it is not the evidence of the node that was
// asked about: its signing key is certified for another node (a node relaying another's
// verification service, or a wrong address), or carries no platform certificate at all, so
// nothing ties it to a node.
var ErrWrongNode = errors.New("evidence is not signed by the node asked about")

// Result is what a verification established, for humans and `-o json`.
type Result struct {
	// Endpoint is the verification service that answered (host:port).
	Endpoint string `json:"endpoint"`
	// Nonce is the fresh nonce the evidence is bound to (hex).
	Nonce string `json:"nonce"`
	// Claims are what the evidence established (inline in JSON).
	Claims
	ClusterID ClusterIDCheck `json:"clusterID"`
}

// Claims are what verified evidence established, for humans and `-o json`: the part of a
// Result that does not depend on how the evidence was obtained (ClaimsOf).
type Claims struct {
	// Variant is the attestation variant of the evidence.
	Variant string `json:"variant"`
	// ReferenceSet names the reference-value set the measurements matched.
	ReferenceSet string `json:"referenceSet"`
	// Warnings lists mismatches of warn-only registers.
	Warnings []string `json:"warnings,omitempty"`
	// Registers are every measured register the evidence covered, by index.
	Registers []Register `json:"registers"`
	Signer    Signer     `json:"signer"`
	// Hardware is what the confidential VM's hardware report established (SEV-SNP, TDX
	// variants); absent for TPM-only variants.
	Hardware *Hardware `json:"hardware,omitempty"`
}

// Hardware is the verified hardware report of a node, for humans and `-o json`.
type Hardware struct {
	Technology string `json:"technology"` // "SEV-SNP", "TDX"
	Product    string `json:"product"`    // "Milan", "Genoa", "Turin"; TDX: the platform's FMSPC
	Signer     string `json:"signer"`     // "VCEK", "VLEK", "PCK"
	TCB        string `json:"tcb"`
	// Reference names the hardware reference the report matched.
	Reference string `json:"reference"`
	// Measurements are the report's launch measurements by name (hex).
	Measurements map[string]string `json:"measurements,omitempty"`
	Warnings     []string          `json:"warnings,omitempty"`
	// RevocationChecked is false when the signer's revocation status was unknown and the
	// validator's policy accepted that (attestation.RevocationUnknownAccepted).
	RevocationChecked bool `json:"revocationChecked"`
}

// Register is one verified measurement register.
type Register struct {
	Index uint32 `json:"index"`
	Name  string `json:"name"`  // "PCR 15"
	Value string `json:"value"` // hex
}

// Signer is the key that signed the evidence.
type Signer struct {
	// ID is the validator's identifier of the key (for a TPM: SHA-256 of the AK's public area).
	ID string `json:"id"`
	// Certified reports whether the key chains to the configured platform roots.
	Certified bool `json:"certified"`
	// Name is the node name the platform certified the key for (when Certified).
	Name string `json:"name,omitempty"`
}

// ClusterIDCheck is the comparison of the node's marker register with the expected cluster.
type ClusterIDCheck struct {
	ClusterID string `json:"clusterID"` // hex
	Register  string `json:"register"`  // "PCR 15"
	Expected  string `json:"expected"`  // hex: SHA256(0^32 || SHA256(clusterID))
	Actual    string `json:"actual"`    // hex
	Match     bool   `json:"match"`
}

// Verifier verifies nodes of one cluster.
type Verifier struct {
	// Validator checks the evidence: parse, verify signature and nonce binding, match
	// reference values. It must be for the variant the nodes attest with.
	Validator attestation.Validator
	// ClusterID is the cluster the node must belong to (32 bytes, from the init).
	ClusterID []byte
	// Timeout bounds a verification whose context has no deadline (DefaultTimeout).
	Timeout time.Duration
	// DialOptions are added to the gRPC client's (tests; proxies).
	DialOptions []grpc.DialOption
}

// Verify asks the verification service of node at endpoint for evidence bound to a fresh
// random nonce and checks it with validator and against clusterID. See Verifier.Verify.
func Verify(ctx context.Context, node, endpoint string, validator attestation.Validator, clusterID []byte) (*Result, error) {
	return Verifier{Validator: validator, ClusterID: clusterID}.Verify(ctx, node, endpoint)
}

// Verify asks the verification service of node at endpoint (host:port of its gRPC port)
// for evidence bound to a fresh random nonce, has the validator check it (signature, binding
// to the nonce for the verification service's purpose, AK certificate, reference values),
// checks that the evidence is node's own (its signing key is certified by the platform for
// that node name), and that the node's PCR 15 carries the marker of the expected cluster.
//
// Why the name: the evidence proves what the signer runs, not where it answered from. Without
// tying the signer to the node asked about, a node could relay another (genuine) node's
// answers and be reported verified. So node is required, and a signer that is not certified
// for it fails closed.
//
// It returns the result and nil when everything passed. When the evidence verified but the
// signer is another node (ErrWrongNode) or the marker is not this cluster's
// (ErrClusterIDMismatch; ClusterID.Match false), it returns the result and an error wrapping
// that reason. Otherwise it returns nil and an error (wrapping the attestation reason, e.g.
// attestation.ErrMeasurementPolicy, when the validator refused).
func (v Verifier) Verify(ctx context.Context, node, endpoint string) (*Result, error) {
	if v.Validator == nil {
		return nil, errors.New("verify: no validator")
	}
	if node == "" {
		return nil, errors.New("verify: no node name to tie the evidence to")
	}
	if len(v.ClusterID) == 0 {
		return nil, errors.New("verify: no cluster ID to check the node against")
	}
	if _, ok := ctx.Deadline(); !ok {
		timeout := v.Timeout
		if timeout <= 0 {
			timeout = DefaultTimeout
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	nonce := make([]byte, NonceSize)
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("verify: generating nonce: %w", err)
	}
	resp, err := fetch(ctx, endpoint, nonce, v.DialOptions)
	if err != nil {
		return nil, err
	}
	want := v.Validator.Variant().String()
	if resp.GetVariant() != want {
		return nil, fmt.Errorf("verify %s: node attests with variant %s, expected %q: %w", endpoint, untrusted.Quote(resp.GetVariant()), want, attestation.ErrWrongVariant)
	}
	verified, err := v.Validator.Validate(ctx, resp.GetEvidence(), attestation.PurposeVerify, nonce)
	if err != nil {
		return nil, fmt.Errorf("verify %s: evidence refused: %w", endpoint, err)
	}
	res := newResult(endpoint, nonce, verified)
	res.ClusterID = checkClusterID(verified, v.ClusterID)
	if !verified.SignerCertified {
		return res, fmt.Errorf("verify %s: %w: the signing key carries no platform certificate, so nothing ties the evidence to node %q", endpoint, ErrWrongNode, node)
	}
	if verified.SignerName != node {
		return res, fmt.Errorf("verify %s: %w: evidence signed by a key the platform certified for %s, not %q (the address answered with another node's evidence: a relay, or a wrong address)",
			endpoint, ErrWrongNode, untrusted.Quote(verified.SignerName), node)
	}
	if !res.ClusterID.Match {
		reason := "it belongs to another cluster"
		if a, _ := hex.DecodeString(res.ClusterID.Actual); len(a) > 0 && bytes.Equal(a, make([]byte, len(a))) {
			reason = "it is not initialized"
		}
		return res, fmt.Errorf("verify %s: %w: %s (%s is %s, cluster %s has marker %s)", endpoint, ErrClusterIDMismatch, reason,
			res.ClusterID.Register, orNone(res.ClusterID.Actual), res.ClusterID.ClusterID, res.ClusterID.Expected)
	}
	return res, nil
}

// maxResponseSize bounds the answer: the evidence limit plus room for the variant.
const maxResponseSize = attestation.DefaultMaxEvidenceSize + 4<<10

func fetch(ctx context.Context, endpoint string, nonce []byte, extra []grpc.DialOption) (*verifypb.GetAttestationResponse, error) {
	// No TLS: the evidence authenticates itself (signed over our nonce).
	opts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxResponseSize)),
	}, extra...)
	conn, err := grpc.NewClient(endpoint, opts...)
	if err != nil {
		return nil, fmt.Errorf("verify %s: %w", endpoint, err)
	}
	defer conn.Close()
	resp, err := verifypb.NewVerificationServiceClient(conn).GetAttestation(ctx, &verifypb.GetAttestationRequest{Nonce: nonce})
	if err != nil {
		// The status is the service's: its message is the service's text (up to the
		// response limit, any bytes), made one bounded, escaped line.
		return nil, fmt.Errorf("verify %s: asking for evidence: %w", endpoint, untrustedgrpc.Status(err))
	}
	return resp, nil
}

func newResult(endpoint string, nonce []byte, v *attestation.Verified) *Result {
	return &Result{Endpoint: endpoint, Nonce: hex.EncodeToString(nonce), Claims: ClaimsOf(v)}
}

// ClaimsOf returns the claims of verified evidence, for output.
func ClaimsOf(v *attestation.Verified) Claims {
	c := Claims{
		Variant:      v.Variant.String(),
		ReferenceSet: v.ReferenceSet,
		Warnings:     v.Warnings,
		Signer:       Signer{ID: v.SignerID, Certified: v.SignerCertified, Name: v.SignerName},
	}
	if hw := v.Hardware; hw != nil {
		c.Hardware = &Hardware{Technology: hw.Technology, Product: hw.Product, Signer: hw.Signer, TCB: hw.TCB, Reference: hw.Reference, Warnings: hw.Warnings, RevocationChecked: hw.RevocationChecked}
		if len(hw.Measurements) > 0 {
			c.Hardware.Measurements = map[string]string{}
			for name, val := range hw.Measurements {
				c.Hardware.Measurements[name] = hex.EncodeToString(val)
			}
		}
	}
	idx := make([]uint32, 0, len(v.Registers))
	for i := range v.Registers {
		idx = append(idx, i)
	}
	slices.Sort(idx)
	for _, i := range idx {
		c.Registers = append(c.Registers, Register{Index: i, Name: v.Variant.RegisterName(i), Value: hex.EncodeToString(v.Registers[i])})
	}
	return c
}

// checkClusterID compares the marker register with the value clusterID implies.
func checkClusterID(v *attestation.Verified, clusterID []byte) ClusterIDCheck {
	want := v.Variant.ClusterIDMarker(clusterID)
	reg, ok := v.Variant.ClusterIDRegister()
	if !ok {
		// A variant without a marker register cannot show membership: never a match.
		return ClusterIDCheck{ClusterID: hex.EncodeToString(clusterID), Register: "none", Expected: hex.EncodeToString(want)}
	}
	got := v.Registers[reg]
	return ClusterIDCheck{
		ClusterID: hex.EncodeToString(clusterID),
		Register:  v.Variant.RegisterName(reg),
		Expected:  hex.EncodeToString(want),
		Actual:    hex.EncodeToString(got),
		Match:     bytes.Equal(got, want),
	}
}

func orNone(s string) string {
	if s == "" {
		return "not covered by the evidence"
	}
	return s
}
