// Package azuretest builds synthetic Azure HCL reports for tests: the layout azure.ParseHCLReport
// reads, around a hardware report and runtime data the test chooses.
package azuretest

import (
	"crypto/rsa"
	"encoding/binary"
	"encoding/json"

	"github.com/openconstellation/constellation/pkg/attestation/azure"
)

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
