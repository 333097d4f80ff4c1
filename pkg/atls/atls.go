// Package atls implements Constellation's attested channel: TLS 1.3 connections whose peer
// has proved, by remote attestation evidence bound to that very connection, what it booted.
//
// The protocol (docs/atls.md) runs a plain TLS 1.3 handshake, then exchanges attestation
// frames inside the encrypted channel before any application data. Evidence is bound to
// SHA-256(label || role || TLS exporter), a value that is fresh for every connection (it
// depends on both sides' randoms and the ephemeral key exchange) and that a man in the middle
// cannot make equal on its two connections. So evidence cannot be replayed on another
// connection, relayed through a proxy, or reflected back to its issuer, by construction: no
// nonces in SNI, no special certificates.
//
// Modes follow from the configuration of each side: a side with an Issuer can attest, a side
// with Validators requires its peer to attest. Server-attested, client-attested and mutual
// are the three useful combinations. Credentials implements gRPC's TransportCredentials.
package atls

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/openconstellation/constellation/pkg/api/atls/atlspb"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/untrusted"
)

const (
	// ALPN is the application protocol both sides must negotiate; a plain TLS peer fails the
	// TLS handshake instead of hanging in the attestation exchange.
	ALPN = "constellation-atls/1"
	// protocolVersion is carried in Hello.
	protocolVersion = 1
	// exporterLabel is the RFC 8446 exporter label for the evidence binding.
	exporterLabel = "EXPORTER-constellation-atls-v1"
	// DefaultHandshakeTimeout bounds TLS handshake plus attestation when the context has no
	// deadline.
	DefaultHandshakeTimeout = 20 * time.Second
)

// Role is the TLS role of a side.
type Role string

// Roles.
const (
	RoleClient Role = "client"
	RoleServer Role = "server"
)

// purpose is the purpose of evidence a side in role issues: the role is part of the binding,
// so a peer cannot reflect the other side's evidence back as its own.
func (r Role) purpose() attestation.Purpose {
	if r == RoleClient {
		return attestation.PurposeATLSClient
	}
	return attestation.PurposeATLSServer
}

func (r Role) peer() Role {
	if r == RoleClient {
		return RoleServer
	}
	return RoleClient
}

// Config is one side's attestation configuration.
type Config struct {
	// Issuer attests this side; nil if this side does not attest.
	Issuer attestation.Issuer
	// Validators are the variants accepted from the peer; none if the peer need not attest.
	Validators []attestation.Validator
	// MaxEvidenceSize caps the peer's evidence (default attestation.DefaultMaxEvidenceSize).
	MaxEvidenceSize int
	// HandshakeTimeout applies when the context has no deadline (default 20 s).
	HandshakeTimeout time.Duration
	// Admit, when set, is asked on every connection right after the TLS handshake, before
	// any attestation frame is exchanged and so before any evidence is issued or validated.
	// An error refuses the connection: the handshake fails with reason "refused" and the
	// error's text is sent to the peer in the Abort. On success, release is called once the
	// attested handshake has ended, whether it succeeded or not. Servers bound concurrent
	// handshakes and their rate per peer with it (internal/handshakelimit), so a refused peer
	// costs no TPM quote and no verification. It runs after the TLS handshake so that the
	// refused peer learns why over the encrypted channel; a TLS handshake costs one Ed25519
	// signature and one X25519 exchange, a small fraction of a quote.
	Admit func(ctx context.Context, remote net.Addr) (release func(), err error)
}

// Credentials makes attested connections with one configuration, in either role.
type Credentials struct {
	cfg Config
	// cert makes the server role's certificate on first use: credentials only ever used as
	// a client (the CLI, a joining node) never pay for a key pair and a signature.
	cert func() (tls.Certificate, error)
}

// NewCredentials checks cfg. The TLS certificate of the server role is made when the
// credentials first serve a connection: it is ephemeral and self-signed, never trusted as
// such (authentication comes from the evidence bound to each connection). Ed25519 because it
// is the cheapest signature to make and check per handshake.
func NewCredentials(cfg Config) (*Credentials, error) {
	if cfg.Issuer == nil && len(cfg.Validators) == 0 {
		return nil, errors.New("atls: neither issuer nor validators: use plain TLS instead")
	}
	seen := map[string]bool{}
	for _, v := range cfg.Validators {
		if seen[v.Variant().String()] {
			return nil, fmt.Errorf("atls: two validators for variant %s", v.Variant())
		}
		seen[v.Variant().String()] = true
	}
	if cfg.MaxEvidenceSize <= 0 {
		cfg.MaxEvidenceSize = attestation.DefaultMaxEvidenceSize
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	return &Credentials{cfg: cfg, cert: sync.OnceValues(ephemeralCert)}, nil
}

// Conn is an established attested connection.
type Conn struct {
	*tls.Conn
	peer *attestation.Verified
}

// Peer returns the verified evidence of the peer, or nil if this side did not require it.
func (c *Conn) Peer() *attestation.Verified { return c.peer }

// Dial connects to addr and runs the client side of the handshake.
func (c *Credentials) Dial(ctx context.Context, network, addr string) (*Conn, error) {
	var d net.Dialer
	raw, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, fmt.Errorf("atls: dialing %s: %w", addr, err)
	}
	return c.Client(ctx, raw)
}

// Client runs the client side over raw. On error raw is closed.
func (c *Credentials) Client(ctx context.Context, raw net.Conn) (*Conn, error) {
	tlsConn := tls.Client(raw, &tls.Config{
		MinVersion:             tls.VersionTLS13,
		NextProtos:             []string{ALPN},
		ServerName:             "atls",
		SessionTicketsDisabled: true,
		// The server's certificate is ephemeral and proves nothing on its own; the peer is
		// authenticated by evidence bound to this connection's exporter (see package doc).
		InsecureSkipVerify: true,
	})
	return c.handshake(ctx, tlsConn, RoleClient, false)
}

// Server runs the server side over raw. On error raw is closed.
func (c *Credentials) Server(ctx context.Context, raw net.Conn) (*Conn, error) {
	return c.handshake(ctx, tls.Server(raw, c.serverTLSConfig()), RoleServer, false)
}

// serverKeepingDeadline is Server for gRPC: the handshake's deadline stays on raw when it
// succeeds, so that it bounds what gRPC reads next (the HTTP/2 preface) too; gRPC clears the
// deadline once its transport is up. Cleared here, a peer that finished the attested
// handshake and then sent nothing would hold the connection, its goroutine and gRPC's
// buffers forever.
func (c *Credentials) serverKeepingDeadline(ctx context.Context, raw net.Conn) (*Conn, error) {
	tlsConn := tls.Server(raw, c.serverTLSConfig())
	return c.handshake(ctx, tlsConn, RoleServer, true)
}

func (c *Credentials) serverTLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		NextProtos: []string{ALPN},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			cert, err := c.cert()
			if err != nil {
				return nil, fmt.Errorf("atls: creating TLS certificate: %w", err)
			}
			return &cert, nil
		},
		SessionTicketsDisabled: true,
	}
}

// Error is a failed attested handshake.
type Error struct {
	// Local is true when this side rejected the connection, false when the peer aborted.
	Local bool
	// Reason is the failure reason label (attestation.Reason) when evidence was rejected,
	// "incompatible" when no common variant exists, "refused" when Config.Admit refused the
	// peer, ReasonPeerAbort when the peer aborted, "protocol" otherwise.
	Reason string
	// PeerReason is, when the peer aborted, the reason label its Abort gave (its own Reason:
	// "measurement-mismatch" when it refused this side's evidence for what it measures), or
	// "" when it gave none (a peer that predates labels) or one that is not a label of this
	// package or attestation.Reason. It is the peer's word for why it aborted: it tells a
	// refusal from a transient failure to whoever reports it, and proves nothing.
	PeerReason string
	Err        error
}

// ReasonPeerAbort is Error.Reason when the peer aborted the handshake (Local is false).
const ReasonPeerAbort = "peer-abort"

// Reason labels of this side besides attestation.Reason's: no common variant, refused by
// Config.Admit, anything else of the protocol.
const (
	reasonIncompatible = "incompatible"
	reasonRefused      = "refused"
	reasonProtocol     = "protocol"
)

// peerLabel is the label of a peer's Abort as this side keeps it: one of the labels a side
// sends (its Error.Reason when Local), else "".
func peerLabel(label string) string {
	switch {
	case label == reasonIncompatible, label == reasonRefused, label == reasonProtocol, attestation.IsReason(label):
		return label
	}
	return ""
}

func (e *Error) Error() string {
	if e.Local {
		return "attested handshake: " + e.Err.Error()
	}
	return "attested handshake: peer aborted: " + e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

// handshake runs the TLS handshake and the attestation exchange within ctx's deadline (or
// HandshakeTimeout), set on conn; keepDeadline leaves it there on success.
func (c *Credentials) handshake(ctx context.Context, conn *tls.Conn, role Role, keepDeadline bool) (*Conn, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.HandshakeTimeout)
		defer cancel()
	}
	deadline, _ := ctx.Deadline()
	if err := conn.SetDeadline(deadline); err != nil {
		conn.Close()
		return nil, err
	}
	peer, err := c.exchange(ctx, conn, role)
	if err != nil {
		conn.Close()
		return nil, err
	}
	if !keepDeadline {
		if err := conn.SetDeadline(time.Time{}); err != nil {
			conn.Close()
			return nil, err
		}
	}
	return &Conn{Conn: conn, peer: peer}, nil
}

func (c *Credentials) exchange(ctx context.Context, conn *tls.Conn, role Role) (*attestation.Verified, error) {
	if err := conn.HandshakeContext(ctx); err != nil {
		return nil, &Error{Local: true, Reason: reasonProtocol, Err: fmt.Errorf("TLS: %w", err)}
	}
	state := conn.ConnectionState()
	if state.Version != tls.VersionTLS13 || state.NegotiatedProtocol != ALPN {
		return nil, &Error{Local: true, Reason: reasonProtocol, Err: fmt.Errorf("peer does not speak %s", ALPN)}
	}
	exporter, err := state.ExportKeyingMaterial(exporterLabel, nil, 32)
	if err != nil {
		return nil, &Error{Local: true, Reason: reasonProtocol, Err: err}
	}

	w := newFrameWriter(conn)
	verified, err := c.admitAndRun(ctx, conn, w, role, exporter)
	if err != nil {
		var e *Error
		if errors.As(err, &e) && e.Local {
			w.send(&atlspb.Frame{Kind: &atlspb.Frame_Abort{Abort: &atlspb.Abort{Reason: abortReason(e.Err), Label: e.Reason}}})
		}
		_ = w.finish()
		return nil, err
	}
	if err := w.finish(); err != nil {
		return nil, &Error{Local: true, Reason: reasonProtocol, Err: fmt.Errorf("writing: %w", err)}
	}
	return verified, nil
}

// admitAndRun asks Config.Admit, then runs the attestation exchange; the admission is
// released when the exchange ends.
func (c *Credentials) admitAndRun(ctx context.Context, conn *tls.Conn, w *frameWriter, role Role, exporter []byte) (*attestation.Verified, error) {
	if c.cfg.Admit != nil {
		release, err := c.cfg.Admit(ctx, conn.RemoteAddr())
		if err != nil {
			return nil, &Error{Local: true, Reason: reasonRefused, Err: err}
		}
		defer release()
	}
	return c.run(ctx, conn, w, role, exporter)
}

// run is the attestation exchange (docs/atls.md "Protocol"), in order:
//
//  1. hellos: each side says the variant it issues and those it accepts;
//  2. decide both directions before any expensive work: the validator for the peer's
//     evidence, and whether we must attest;
//  3. our evidence, bound to this connection's exporter, if the peer requires it;
//  4. the peer's evidence, validated, and our verdict on it;
//  5. the peer's verdict on ours.
func (c *Credentials) run(ctx context.Context, conn *tls.Conn, w *frameWriter, role Role, exporter []byte) (*attestation.Verified, error) {
	hello, peerHello, err := c.exchangeHellos(conn, w)
	if err != nil {
		return nil, err
	}
	validator, err := c.chooseValidator(hello, peerHello)
	if err != nil {
		return nil, err
	}
	mustAttest := len(peerHello.AcceptedVariants) > 0
	if mustAttest {
		if err := c.attest(ctx, w, role, exporter, hello, peerHello); err != nil {
			return nil, err
		}
	}
	var verified *attestation.Verified
	if validator != nil {
		if verified, err = c.verifyPeer(ctx, conn, w, role, exporter, validator, peerHello); err != nil {
			return nil, err
		}
	}
	if mustAttest {
		f, err := c.read(conn, maxHelloFrame)
		if err != nil {
			return nil, err
		}
		if v := f.GetVerdict(); v == nil || !v.Accepted {
			// The frame's kind, not its content: a peer's strings stay out of the error.
			return nil, localError(reasonProtocol, "expected an accepting Verdict, got %T", f.Kind)
		}
	}
	return verified, nil
}

// localError is an *Error of this side.
func localError(reason string, format string, args ...any) error {
	return &Error{Local: true, Reason: reason, Err: fmt.Errorf(format, args...)}
}

// exchangeHellos sends our Hello and reads the peer's, which must speak our version.
func (c *Credentials) exchangeHellos(conn *tls.Conn, w *frameWriter) (hello, peerHello *atlspb.Hello, err error) {
	hello = &atlspb.Hello{Version: protocolVersion}
	if c.cfg.Issuer != nil {
		hello.IssuerVariant = c.cfg.Issuer.Variant().String()
	}
	for _, v := range c.cfg.Validators {
		hello.AcceptedVariants = append(hello.AcceptedVariants, v.Variant().String())
	}
	w.send(&atlspb.Frame{Kind: &atlspb.Frame_Hello{Hello: hello}})

	f, err := c.read(conn, maxHelloFrame)
	if err != nil {
		return nil, nil, err
	}
	peerHello = f.GetHello()
	if peerHello == nil {
		return nil, nil, localError(reasonProtocol, "expected Hello, got %T", f.Kind)
	}
	if peerHello.Version != protocolVersion {
		return nil, nil, localError(reasonProtocol, "peer speaks protocol version %d, we speak %d", peerHello.Version, protocolVersion)
	}
	return hello, peerHello, nil
}

// chooseValidator returns our validator of the variant the peer issues, nil if we do not
// require evidence, or an error if the peer offers nothing we accept.
func (c *Credentials) chooseValidator(hello, peerHello *atlspb.Hello) (attestation.Validator, error) {
	if len(c.cfg.Validators) == 0 {
		return nil, nil
	}
	if peerHello.IssuerVariant == "" {
		return nil, localError(reasonIncompatible, "no compatible evidence: peer does not attest; we require one of [%s]", strings.Join(hello.AcceptedVariants, ", "))
	}
	var validator attestation.Validator
	for _, v := range c.cfg.Validators {
		if v.Variant().String() == peerHello.IssuerVariant {
			validator = v
		}
	}
	if validator == nil {
		return nil, localError(reasonIncompatible, "no compatible evidence: peer offers %s; we accept [%s]", untrusted.Quote(peerHello.IssuerVariant), strings.Join(hello.AcceptedVariants, ", "))
	}
	return validator, nil
}

// attest sends our evidence for the peer, which requires it, bound to exporter.
func (c *Credentials) attest(ctx context.Context, w *frameWriter, role Role, exporter []byte, hello, peerHello *atlspb.Hello) error {
	if c.cfg.Issuer == nil {
		return localError(reasonIncompatible, "no compatible evidence: peer requires one of %s; we do not attest", untrusted.QuoteList(peerHello.AcceptedVariants))
	}
	if !slices.Contains(peerHello.AcceptedVariants, hello.IssuerVariant) {
		return localError(reasonIncompatible, "no compatible evidence: we offer %s; peer accepts %s", hello.IssuerVariant, untrusted.QuoteList(peerHello.AcceptedVariants))
	}
	evidence, err := c.cfg.Issuer.Issue(ctx, role.purpose(), exporter)
	if err != nil {
		return localError("issue", "issuing evidence: %w", err)
	}
	frame := &atlspb.Frame{Kind: &atlspb.Frame_Evidence{Evidence: &atlspb.Evidence{Variant: hello.IssuerVariant, Evidence: evidence}}}
	if len(c.cfg.Validators) > 0 {
		// The peer sends its evidence now too: write ours while we read it.
		w.sendBehind(frame)
	} else {
		w.send(frame)
	}
	return nil
}

// verifyPeer reads the peer's evidence, validates it for exporter and the peer's purpose,
// and sends our accepting verdict.
func (c *Credentials) verifyPeer(ctx context.Context, conn *tls.Conn, w *frameWriter, role Role, exporter []byte, validator attestation.Validator, peerHello *atlspb.Hello) (*attestation.Verified, error) {
	f, err := c.read(conn, c.cfg.MaxEvidenceSize+frameOverhead)
	if errors.Is(err, errFrameTooLarge) {
		return nil, &Error{Local: true, Reason: attestation.Reason(attestation.ErrTooLarge), Err: fmt.Errorf("%w: %w", attestation.ErrTooLarge, errors.Unwrap(err))}
	}
	if err != nil {
		return nil, err
	}
	ev := f.GetEvidence()
	if ev == nil {
		return nil, localError(reasonProtocol, "expected Evidence, got %T", f.Kind)
	}
	if ev.Variant != peerHello.IssuerVariant {
		return nil, &Error{Local: true, Reason: attestation.Reason(attestation.ErrWrongVariant), Err: fmt.Errorf("%w: announced %s, sent %s", attestation.ErrWrongVariant, untrusted.Quote(peerHello.IssuerVariant), untrusted.Quote(ev.Variant))}
	}
	verified, err := validator.Validate(ctx, ev.Evidence, role.peer().purpose(), exporter)
	if err != nil {
		return nil, &Error{Local: true, Reason: attestation.Reason(err), Err: err}
	}
	w.send(&atlspb.Frame{Kind: &atlspb.Frame_Verdict{Verdict: &atlspb.Verdict{Accepted: true}}})
	return verified, nil
}

// read reads a frame and turns a peer's Abort into an error. The reason is the peer's text:
// up to the frame limit (the evidence limit, 256 KiB, while evidence is awaited), with any
// bytes it likes, terminal escape sequences and line breaks among them. It reaches errors,
// logs and the operator's terminal, so it is made one bounded, printable line here, where it
// enters (untrusted.Text).
func (c *Credentials) read(conn *tls.Conn, limit int) (*atlspb.Frame, error) {
	f, err := readFrame(conn, limit)
	if err != nil {
		return nil, &Error{Local: true, Reason: reasonProtocol, Err: err}
	}
	if a := f.GetAbort(); a != nil {
		return nil, &Error{Local: false, Reason: ReasonPeerAbort, PeerReason: peerLabel(a.Label), Err: errors.New(untrusted.Text(a.Reason))}
	}
	return f, nil
}

// maxAbortReason bounds the reason this side sends in an Abort, so that the frame fits the
// smallest limit the peer reads with (maxHelloFrame, while it waits for a Verdict): a longer
// reason (every mismatching register of a reference set) would reach the peer as "frame too
// large" instead of the reason. The peer keeps less of it anyway (untrusted.Text); the whole
// reason stays in this side's error.
const maxAbortReason = 2 << 10

// abortReason is the text of err to send in an Abort: at most maxAbortReason bytes, cut at a
// rune boundary.
func abortReason(err error) string {
	s := err.Error()
	if len(s) <= maxAbortReason {
		return s
	}
	cut := maxAbortReason
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…(cut)"
}

// Binding returns the report data that evidence issued by a side in role must bind on a
// connection with the given exporter value: attestation.ReportData of the role's purpose
// over the exporter (docs/atls.md).
func Binding(role Role, exporter []byte) ([]byte, error) {
	return attestation.ReportData(role.purpose(), exporter)
}

func ephemeralCert() (tls.Certificate, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "constellation-atls"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, priv)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: priv}, nil
}
