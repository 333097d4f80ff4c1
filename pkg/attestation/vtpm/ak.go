package vtpm

import (
	"fmt"
	"io"

	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"
)

// AKAlgorithm selects which of the TPM's two attestation keys an issuer quotes with.
//
// The trade-off is who pays: an RSA-2048 quote costs ~5 ms on swtpm and ~45 µs to verify;
// an ECC P-256 quote costs ~1.5 ms on swtpm and ~105 µs to verify (docs/benchmarks.md).
// Nodes use RSA (the default): their evidence is verified by every join, so verify cost
// is what scales. A service that quotes once per incoming connection (the join service in
// mutual attestation) uses ECC: its quote is on the critical path of every join, while
// each peer verifies it only once.
//
// Both AKs are primary keys under the owner hierarchy made persistent at go-tpm-tools'
// default handles, so each is created once per TPM and is stable across restarts: the
// platform certifies both once and stores the certificates at their NV indexes. Template
// is the one definition of each key; the platform that certifies an AK and every issuer that
// quotes with it load it through here, so they always mean the same key.
type AKAlgorithm int

const (
	// AKRSA is the RSA-2048 AK at client.DefaultAKRSAHandle, certified at AKCertNVIndex.
	AKRSA AKAlgorithm = iota
	// AKECC is the ECC P-256 AK at client.DefaultAKECCHandle, certified at AKCertNVIndexECC.
	AKECC
)

// AKAlgorithms lists every AK algorithm, for platforms that certify all of them.
var AKAlgorithms = []AKAlgorithm{AKRSA, AKECC}

func (a AKAlgorithm) String() string {
	switch a {
	case AKRSA:
		return "rsa"
	case AKECC:
		return "ecc"
	}
	return fmt.Sprintf("AKAlgorithm(%d)", int(a))
}

// CertNVIndex returns the NV index where the platform stores this AK's certificate.
func (a AKAlgorithm) CertNVIndex() uint32 {
	if a == AKECC {
		return AKCertNVIndexECC
	}
	return AKCertNVIndex
}

// AKAttributes are the object attributes of our AKs: go-tpm-tools' (a restricted signing key
// that never leaves the TPM, usable with its empty authValue) plus noDA.
//
// Without noDA every quote is an authorization of a DA-protected object. Such a TPM counts
// a start-up after a power loss (no TPM2_Shutdown) as one authorization failure if a
// DA-protected object was used since the last start-up; after MAX_AUTH_FAIL (3 on swtpm) of
// them it is in dictionary-attack lockout and refuses every quote until LOCKOUT_INTERVAL
// (1000 s on swtpm) of uninterrupted uptime forgave one, which a node that keeps being
// restarted never has. The AK's authValue is empty and public, so no authorization of it can
// fail and there is nothing to guess: DA protection guards secrets, and this key has none
// (docs/node-lifecycle.md, "Power loss and the TPM").
const AKAttributes = tpm2.FlagSignerDefault | tpm2.FlagNoDA

// Template returns the template the AK is created from: go-tpm-tools' AKTemplateRSA or
// AKTemplateECC with AKAttributes.
func (a AKAlgorithm) Template() (tpm2.Public, error) {
	var t tpm2.Public
	switch a {
	case AKRSA:
		t = client.AKTemplateRSA()
	case AKECC:
		t = client.AKTemplateECC()
	default:
		return tpm2.Public{}, fmt.Errorf("unknown AK algorithm %d", int(a))
	}
	t.Attributes = AKAttributes
	return t, nil
}

// Handle returns the persistent handle the AK is kept at.
func (a AKAlgorithm) Handle() tpmutil.Handle {
	if a == AKECC {
		return client.DefaultAKECCHandle
	}
	return client.DefaultAKRSAHandle
}

// load loads the AK from its persistent handle, or creates it from Template and persists
// it. A key of another template at the handle (an AK of an earlier version, without noDA) is
// evicted and replaced; the platform certifies the new key at the next boot.
func (a AKAlgorithm) load(rw io.ReadWriter) (*client.Key, error) {
	t, err := a.Template()
	if err != nil {
		return nil, err
	}
	return client.NewCachedKey(rw, tpm2.HandleOwner, t, a.Handle())
}
