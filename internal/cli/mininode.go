package cli

import (
	"context"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/openconstellation/constellation/internal/atls"
	"github.com/openconstellation/constellation/internal/attestation"
	"github.com/openconstellation/constellation/internal/attestation/measurements"
	"github.com/openconstellation/constellation/internal/attestation/qemu"
	"github.com/openconstellation/constellation/internal/attestation/vtpm"
)

// nodeEvent is one line a preview node prints (JSON) for `mini up` to report.
type nodeEvent struct {
	Event     string            `json:"event"` // listening, verified, rejected
	Node      string            `json:"node"`
	Addr      string            `json:"addr,omitempty"`
	Set       string            `json:"set,omitempty"`
	Signer    string            `json:"signer,omitempty"`
	Certified bool              `json:"certified,omitempty"`
	Registers map[string]string `json:"registers,omitempty"`
	Warnings  []string          `json:"warnings,omitempty"`
	Error     string            `json:"error,omitempty"`
}

type nodeFlags struct {
	name, tpm, listen, dial, refs, roots string
	accept                               int
}

// newMiniNodeCmd runs one node of the preview flow: it attests with its vTPM and requires
// the same of its peer (mutual aTLS). Hidden: `mini up` starts it.
func newMiniNodeCmd() *cobra.Command {
	var f nodeFlags
	cmd := &cobra.Command{
		Use:    "node",
		Short:  "Run one preview node (started by mini up)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Minute)
			defer cancel()
			return runNode(ctx, f, json.NewEncoder(cmd.OutOrStdout()))
		},
	}
	cmd.Flags().StringVar(&f.name, "name", "", "node name")
	cmd.Flags().StringVar(&f.tpm, "tpm", "", "TPM address (unix:PATH, tcp:HOST:PORT or a device)")
	cmd.Flags().StringVar(&f.listen, "listen", "", "serve attested connections on this address")
	cmd.Flags().IntVar(&f.accept, "accept", 1, "number of connections to serve")
	cmd.Flags().StringVar(&f.dial, "dial", "", "connect to this address")
	cmd.Flags().StringVar(&f.refs, "reference-values", "", "JSON file of reference-value sets")
	cmd.Flags().StringVar(&f.roots, "ak-roots", "", "PEM file of AK certificate roots")
	return cmd
}

func runNode(ctx context.Context, f nodeFlags, out *json.Encoder) error {
	tpm, err := vtpm.Open(ctx, f.tpm)
	if err != nil {
		return err
	}
	defer tpm.Close()
	iss, err := qemu.NewIssuer(tpm, nil, nil)
	if err != nil {
		return err
	}
	var sets measurements.ReferenceSets
	raw, err := os.ReadFile(f.refs)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, &sets); err != nil {
		return fmt.Errorf("reference values %s: %w", f.refs, err)
	}
	rootsPEM, err := os.ReadFile(f.roots)
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(rootsPEM) {
		return fmt.Errorf("no certificate in %s", f.roots)
	}
	val, err := qemu.NewValidator(qemu.ValidatorConfig{ReferenceSets: sets, AKRoots: roots})
	if err != nil {
		return err
	}
	creds, err := atls.NewCredentials(atls.Config{Issuer: iss, Validators: []attestation.Validator{val}})
	if err != nil {
		return err
	}
	report := func(conn *atls.Conn, err error) error {
		if err != nil {
			return out.Encode(nodeEvent{Event: "rejected", Node: f.name, Error: err.Error()})
		}
		defer conn.Close()
		p := conn.Peer()
		regs := map[string]string{}
		for i, v := range p.Registers {
			if i < 16 {
				regs[fmt.Sprint(i)] = hex.EncodeToString(v)
			}
		}
		return out.Encode(nodeEvent{Event: "verified", Node: f.name, Set: p.ReferenceSet, Signer: p.SignerID, Certified: p.SignerCertified, Registers: regs, Warnings: p.Warnings})
	}

	if f.listen != "" {
		ln, err := net.Listen("tcp", f.listen)
		if err != nil {
			return err
		}
		defer ln.Close()
		if err := out.Encode(nodeEvent{Event: "listening", Node: f.name, Addr: ln.Addr().String()}); err != nil {
			return err
		}
		for range f.accept {
			raw, err := ln.Accept()
			if err != nil {
				return err
			}
			if err := report(creds.Server(ctx, raw)); err != nil {
				return err
			}
		}
		return nil
	}
	return report(creds.Dial(ctx, "tcp", f.dial))
}
