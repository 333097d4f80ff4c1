// Package azuretest builds synthetic Azure HCL reports for tests: the layout azure.ParseHCLReport
// reads, around a hardware report and runtime data the test chooses.
package azuretest

import (
	"crypto/rsa"
	"encoding/binary"
	"encoding/json"
	"io"
	"testing"

	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"

	"github.com/openconstellation/constellation/pkg/attestation/azure"
	"github.com/openconstellation/constellation/pkg/attestation/vtpm"
)

// ProvisionAK creates the HCL's attestation key at azure.AKHandle in tpm, as Azure's HCL
// does at boot, and returns its public key (what runtime data names).
func ProvisionAK(t testing.TB, tpm *vtpm.TPM) *rsa.PublicKey {
	t.Helper()
	var pub *rsa.PublicKey
	err := tpm.With(func(rw io.ReadWriter) error {
		ak, err := client.NewCachedKey(rw, tpm2.HandleOwner, client.AKTemplateRSA(), azure.AKHandle)
		if err != nil {
			return err
		}
		defer ak.Close()
		pub = ak.PublicKey().(*rsa.PublicKey)
		return nil
	})
	if err != nil {
		t.Fatalf("provisioning the HCL AK: %v", err)
	}
	return pub
}

// RuntimeData returns runtime data naming ak (and ek, if not nil) as the HCL does.
func RuntimeData(ak, ek *rsa.PublicKey) []byte {
	keys := []any{azure.RSAJWK(azure.KeyIDAK, ak)}
	if ek != nil {
		keys = append(keys, azure.RSAJWK(azure.KeyIDEK, ek))
	}
	b, err := json.Marshal(map[string]any{
		"keys": keys,
		"vm-configuration": map[string]any{
			"console-enabled": false, "secure-boot": true, "tpm-enabled": true,
			"vmUniqueId": "00000000-0000-0000-0000-000000000000",
		},
	})
	if err != nil {
		panic(err) // maps of strings and keys always marshal
	}
	return b
}

// HCLReport lays out an HCL report: header, hw (an SNP report or a TDREPORT) padded to the
// hardware area, the request data header and runtimeData, then pad zero bytes (an NV index
// is larger than the report).
func HCLReport(typ azure.ReportType, hw, runtimeData []byte, pad int) []byte {
	const area = 1184
	out := make([]byte, 32+area+20+len(runtimeData)+pad)
	le := binary.LittleEndian
	copy(out[0:4], "HCLA")
	le.PutUint32(out[4:], 2)
	le.PutUint32(out[8:], uint32(32+area+20+len(runtimeData)))
	le.PutUint32(out[12:], 2) // request type
	copy(out[32:32+area], hw)
	h := out[32+area:]
	le.PutUint32(h[0:], uint32(20+len(runtimeData)))
	le.PutUint32(h[4:], 1)
	le.PutUint32(h[8:], uint32(typ))
	le.PutUint32(h[12:], 1) // SHA-256
	le.PutUint32(h[16:], uint32(len(runtimeData)))
	copy(h[20:], runtimeData)
	return out
}
