package gce_test

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/openconstellation/constellation/pkg/attestation/gce"
)

var testNow = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

// TestPinnedGoogleCertificates: the pinned certificates are the ones CERTIFICATES.md names
// (by fingerprint), roots are self-signed CAs, and every intermediate chains to a root.
func TestPinnedGoogleCertificates(t *testing.T) {
	want := map[string]string{
		"9bd5285f8fb18502a7947e621ffd470266f49fcd3b73e19a190f690ad32a7caf": "root",
		"594759594b9b61524f6c8ef668f7177f7b9066bc0674f2f49fe9e052be78beb2": "root",
		"5d8dbcf8c8053dd8ffad711b6219355032b7122c34cac0f90ccb49def69ec504": "intermediate",
		"7132b6ea71101f6c51bb58f98c3798c19b65be510eca0344318900510b593178": "intermediate",
		"c84de8116dfaf5a908f21e810487791f5437e206d00ad8025050cca6bd2ff627": "intermediate",
	}
	roots := x509.NewCertPool()
	for _, c := range gce.Roots() {
		fp := sha256.Sum256(c.Raw)
		assert.Equal(t, "root", want[hex.EncodeToString(fp[:])], c.Subject.CommonName)
		assert.True(t, c.IsCA)
		assert.NoError(t, c.CheckSignatureFrom(c), "self-signed")
		roots.AddCert(c)
	}
	for _, c := range gce.Intermediates() {
		fp := sha256.Sum256(c.Raw)
		assert.Equal(t, "intermediate", want[hex.EncodeToString(fp[:])], c.Subject.CommonName)
		_, err := c.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: testNow, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
		assert.NoError(t, err, c.Subject.CommonName)
	}
}
