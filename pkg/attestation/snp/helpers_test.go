package snp_test

import (
	"bytes"
	"encoding/json"
	"encoding/pem"
)

// pemDecode returns the DER of the first PEM block of b, or nil (and b) if b is not PEM.
func pemDecode(b []byte) ([]byte, []byte) {
	block, rest := pem.Decode(b)
	if block == nil {
		return nil, b
	}
	return block.Bytes, rest
}

func pemCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func jsonUnmarshalStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}
