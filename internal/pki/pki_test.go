package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestClusterWriteAndLoad(t *testing.T) {
	dir := t.TempDir()
	c, err := NewCluster(time.Now())
	require.NoError(t, err)
	require.NoError(t, c.Write(dir))

	ca, err := LoadCA(filepath.Join(dir, CACert), filepath.Join(dir, CAKey))
	require.NoError(t, err)
	assert.True(t, ca.Cert.Equal(c.CA.Cert))
	files, err := ReadControlPlaneFiles(dir)
	require.NoError(t, err)
	assert.Len(t, files, len(ControlPlaneFiles))
	info, err := os.Stat(filepath.Join(dir, EtcdCAKey))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm(), "keys are private")

	// A key of another CA is refused.
	_, err = LoadCA(filepath.Join(dir, CACert), filepath.Join(dir, FrontProxyCAKey))
	assert.ErrorContains(t, err, "does not belong to")
	require.NoError(t, os.Remove(filepath.Join(dir, EtcdCAKey)))
	_, err = ReadControlPlaneFiles(dir)
	assert.ErrorContains(t, err, "etcd/ca.key")
}

func TestParseKeyForms(t *testing.T) {
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	sec1, err := x509.MarshalECPrivateKey(ec)
	require.NoError(t, err)
	pkcs8, err := EncodeKey(ec)
	require.NoError(t, err)
	for name, data := range map[string][]byte{
		"PKCS#8": pkcs8,
		"SEC 1":  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: sec1}),
		"PKCS#1": pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(rsaKey)}),
	} {
		_, err := ParseKey(data)
		assert.NoError(t, err, name)
	}
	_, err = ParseKey([]byte("junk"))
	assert.Error(t, err)
	_, err = ParseKey(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1}}))
	assert.ErrorContains(t, err, `unexpected PEM block "CERTIFICATE"`)
}

func TestDiscoveryHashPinsTheKey(t *testing.T) {
	ca, err := NewCA("kubernetes", time.Now(), time.Hour)
	require.NoError(t, err)
	// A re-issued certificate for the same key keeps the pin; kubeadm pins keys.
	again, err := ca.Issue(Leaf{CommonName: "kubernetes", NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour)}, ca.Key.Public())
	require.NoError(t, err)
	assert.Equal(t, DiscoveryHash(ca.Cert), DiscoveryHash(again))
	assert.Regexp(t, `^sha256:[0-9a-f]{64}$`, DiscoveryHash(ca.Cert))
	other, err := NewCA("kubernetes", time.Now(), time.Hour)
	require.NoError(t, err)
	assert.NotEqual(t, DiscoveryHash(ca.Cert), DiscoveryHash(other.Cert))
}

// An attacker with write access to the PKI directory plants a symlink at the name the old
// writer used for its temporary file (ca.key.tmp) and a world-readable leftover at the
// final name. WriteFile must not write the key through the symlink, and the key must end
// up 0600 although the file it replaces was 0666.
func TestAttackWriteFileKeyPlants(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(t.TempDir(), "victim")
	require.NoError(t, os.WriteFile(victim, []byte("victim"), 0o644))
	require.NoError(t, os.Symlink(victim, filepath.Join(dir, "ca.key.tmp")))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "ca.key"), []byte("old"), 0o666))
	require.NoError(t, os.Chmod(filepath.Join(dir, "ca.key"), 0o666))

	require.NoError(t, WriteFile(dir, "ca.key", []byte("key")))

	data, err := os.ReadFile(victim)
	require.NoError(t, err)
	assert.Equal(t, "victim", string(data), "the symlink's target is untouched")
	info, err := os.Lstat(filepath.Join(dir, "ca.key"))
	require.NoError(t, err)
	assert.True(t, info.Mode().IsRegular())
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	require.NoError(t, WriteFile(dir, "ca.crt", []byte("cert")))
	info, err = os.Stat(filepath.Join(dir, "ca.crt"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o644), info.Mode().Perm(), "certificates stay readable")
}
