package snp

import (
	"crypto/sha256"
	"crypto/x509"
	"embed"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"strings"
)

// Product lines of AMD EPYC processors with SEV-SNP, as AMD's key distribution service (KDS)
// names them.
const (
	Milan = "Milan"
	Genoa = "Genoa"
	Turin = "Turin"
)

// ProductLines lists every product line this package has pinned roots for.
var ProductLines = []string{Milan, Genoa, Turin}

// rootsFS holds AMD's root keys (ARK) and the signing keys they certify for VCEKs (ASK) and
// VLEKs (ASVK), one PEM certificate per file, as AMD's KDS publishes them at
// https://kdsintf.amd.com/{vcek,vlek}/v1/<product>/cert_chain (copied from go-sev-guest
// v0.14.0's verify/trust; see roots/README.md).
//
//go:embed roots/*.pem
var rootsFS embed.FS

// pinnedFingerprints are the SHA-256 digests of the DER of every pinned certificate. The
// embedded files are checked against them at init, so a changed file in a source tree (a bad
// merge, a tampered checkout) stops every binary at start instead of silently trusting
// another root.
var pinnedFingerprints = map[string]string{
	"roots/ark_milan.pem":  "69d063b45344d26a2e94e1f4210de49ef555308287d4c174445c95639a540bcd",
	"roots/ask_milan.pem":  "67d303bd3905fd38db8b20e0793699870e7fa612eaad5dec358293fd8c0bac1b",
	"roots/asvk_milan.pem": "c5e081f59b7efab1fe2f8b505e159704e72f29cab7ef7cf628a05a42439082f5",
	"roots/ark_genoa.pem":  "4c6598d19c18719c5dfd4a7d335f674e5bfe1d8f800cea2cf270c10d103db2f1",
	"roots/ask_genoa.pem":  "5464738c1546aed5f2cecf1dc98c5c960a92e8913238a61711bc90ec6e828521",
	"roots/asvk_genoa.pem": "197e610743a917d6b9bb982a5a9226ccc0a15b611be0619e626aca9151457372",
	"roots/ark_turin.pem":  "1f084161a44bb6d93778a904877d4819cafa5d05ef4193b2ded9dd9c73dd3f6a",
	"roots/ask_turin.pem":  "5b77ef5fe7a7a004fd9032668fba9d0fda22f88c4442069a479636a6ae3b3185",
	"roots/asvk_turin.pem": "104e10a8bd060a3c20a434261a57d0588fd65a88915b4f65b08bdecaf8df1a3c",
}

// pinned is the parsed and checked set of embedded roots.
var pinned = func() *Roots {
	r, err := loadRoots(rootsFS, pinnedFingerprints)
	if err != nil {
		panic(fmt.Sprintf("snp: embedded AMD roots: %v", err))
	}
	return r
}()

// PinnedRoots returns AMD's roots for every product line, as embedded in the binary.
func PinnedRoots() *Roots { return pinned }

// Roots is a set of trusted AMD certificate chains, one per product line. Evidence never adds
// to it: the ARK, ASK and ASVK that come with a report are ignored.
type Roots struct {
	byProduct map[string]ProductRoots
}

// ProductRoots is the chain of one product line: the self-signed ARK, the ASK that certifies
// VCEKs and the ASVK that certifies VLEKs, both signed by the ARK.
type ProductRoots struct {
	Product string
	ARK     *x509.Certificate
	ASK     *x509.Certificate
	ASVK    *x509.Certificate
}

// NewRoots returns a set of roots after checking each chain is self-consistent (ARK
// self-signed, ASK and ASVK signed by it, common names as AMD's KDS sets them). Verifiers use
// PinnedRoots; NewRoots is for tests with go-sev-guest's fake AMD signers, and for pinning a
// product line this package does not know yet.
func NewRoots(chains ...ProductRoots) (*Roots, error) {
	r := &Roots{byProduct: map[string]ProductRoots{}}
	for _, c := range chains {
		if err := c.check(); err != nil {
			return nil, fmt.Errorf("roots of %q: %w", c.Product, err)
		}
		if _, dup := r.byProduct[c.Product]; dup {
			return nil, fmt.Errorf("roots of %q given twice", c.Product)
		}
		r.byProduct[c.Product] = c
	}
	return r, nil
}

// Product returns the chain of a product line.
func (r *Roots) Product(product string) (ProductRoots, bool) {
	c, ok := r.byProduct[product]
	return c, ok
}

func (c ProductRoots) check() error {
	if c.Product == "" {
		return errors.New("no product line")
	}
	if c.ARK == nil || c.ASK == nil || c.ASVK == nil {
		return errors.New("ARK, ASK and ASVK are all required")
	}
	for _, want := range []struct {
		cert *x509.Certificate
		role string
		cn   string
	}{
		{c.ARK, "ARK", "ARK-" + c.Product},
		{c.ASK, "ASK", "SEV-" + c.Product},
		{c.ASVK, "ASVK", "SEV-VLEK-" + c.Product},
	} {
		if got := want.cert.Subject.CommonName; got != want.cn {
			return fmt.Errorf("%s common name %q, want %q", want.role, got, want.cn)
		}
		if !want.cert.IsCA {
			return fmt.Errorf("%s is not a CA certificate", want.role)
		}
		if err := want.cert.CheckSignatureFrom(c.ARK); err != nil {
			return fmt.Errorf("%s not signed by the ARK: %w", want.role, err)
		}
	}
	return nil
}

// loadRoots reads ark_<product>.pem, ask_<product>.pem and asvk_<product>.pem under roots/ for
// every product line, refusing any file whose certificate is not the one fingerprints names.
func loadRoots(fsys fs.FS, fingerprints map[string]string) (*Roots, error) {
	var chains []ProductRoots
	for _, product := range ProductLines {
		var certs [3]*x509.Certificate
		for i, role := range []string{"ark", "ask", "asvk"} {
			name := fmt.Sprintf("roots/%s_%s.pem", role, strings.ToLower(product))
			cert, err := loadPinnedCert(fsys, name, fingerprints[name])
			if err != nil {
				return nil, err
			}
			certs[i] = cert
		}
		chains = append(chains, ProductRoots{Product: product, ARK: certs[0], ASK: certs[1], ASVK: certs[2]})
	}
	return NewRoots(chains...)
}

func loadPinnedCert(fsys fs.FS, name, fingerprint string) (*x509.Certificate, error) {
	if fingerprint == "" {
		return nil, fmt.Errorf("%s: no pinned fingerprint", name)
	}
	data, err := fs.ReadFile(fsys, name)
	if err != nil {
		return nil, err
	}
	block, rest := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE" || len(strings.TrimSpace(string(rest))) != 0 {
		return nil, fmt.Errorf("%s: want exactly one PEM certificate", name)
	}
	sum := sha256.Sum256(block.Bytes)
	if got := hex.EncodeToString(sum[:]); got != fingerprint {
		return nil, fmt.Errorf("%s: SHA-256 fingerprint %s, pinned %s", name, got, fingerprint)
	}
	return x509.ParseCertificate(block.Bytes)
}
