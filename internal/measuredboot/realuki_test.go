package measuredboot

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The tests in this file check the prediction against independent tools on real binaries
// from Debian packages (hack/install-deps.sh installs them: systemd-boot-efi, binutils,
// systemd, pesign, osslsigncode). They are skipped only under -short.
const (
	stubPath    = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub"
	bootPEPath  = "/usr/lib/systemd/boot/efi/systemd-bootx64.efi" // a real PE, the stand-in kernel
	measurePath = "/lib/systemd/systemd-measure"
)

func needTools(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds a real UKI with Debian's systemd-stub and checks it with external tools")
	}
	for _, f := range []string{stubPath, bootPEPath, measurePath} {
		_, err := os.Stat(f)
		require.NoError(t, err, "missing %s: run make debs", f)
	}
	for _, tool := range []string{"objcopy", "pesign", "osslsigncode"} {
		_, err := exec.LookPath(tool)
		require.NoError(t, err, "missing %s: run make debs", tool)
	}
}

type realUKI struct {
	path                          string
	linux, osrel, cmdline, initrd string
	rawUKI                        []byte
}

// buildRealUKI makes a UKI as the node image build does: Debian's systemd-stub with
// .osrel, .cmdline, .linux and .initrd added by objcopy.
func buildRealUKI(t *testing.T) realUKI {
	t.Helper()
	dir := t.TempDir()
	u := realUKI{
		path:    filepath.Join(dir, "uki.efi"),
		linux:   bootPEPath,
		osrel:   filepath.Join(dir, "os-release"),
		cmdline: filepath.Join(dir, "cmdline"),
		initrd:  filepath.Join(dir, "initrd"),
	}
	require.NoError(t, os.WriteFile(u.osrel, testOsrel, 0o600))
	require.NoError(t, os.WriteFile(u.cmdline, []byte(testCmdline), 0o600))
	initrd := make([]byte, 300_001) // odd size: SizeOfRawData is padded, VirtualSize is not
	_, _ = rand.Read(initrd)
	require.NoError(t, os.WriteFile(u.initrd, initrd, 0o600))
	out, err := exec.Command("objcopy",
		"--add-section", ".osrel="+u.osrel, "--change-section-vma", ".osrel=0x20000",
		"--add-section", ".cmdline="+u.cmdline, "--change-section-vma", ".cmdline=0x30000",
		"--add-section", ".linux="+u.linux, "--change-section-vma", ".linux=0x2000000",
		"--add-section", ".initrd="+u.initrd, "--change-section-vma", ".initrd=0x3000000",
		stubPath, u.path).CombinedOutput()
	require.NoError(t, err, "objcopy: %s", out)
	u.rawUKI, err = os.ReadFile(u.path)
	require.NoError(t, err)
	return u
}

var pcrLine = regexp.MustCompile(`(?m)^11:sha256=([0-9a-f]{64})`)

func systemdMeasure(t *testing.T, u realUKI, phase string) []byte {
	t.Helper()
	out, err := exec.Command(measurePath, "calculate", "--linux="+u.linux, "--osrel="+u.osrel, "--cmdline="+u.cmdline,
		"--initrd="+u.initrd, "--bank=sha256", "--phase="+phase).CombinedOutput()
	require.NoError(t, err, "systemd-measure: %s", out)
	m := pcrLine.FindSubmatch(out)
	require.NotNil(t, m, "systemd-measure output: %s", out)
	v, err := hex.DecodeString(string(m[1]))
	require.NoError(t, err)
	return v
}

// TestPCR11AgainstSystemdMeasure compares the PCR 11 predicted from a real UKI's bytes with
// systemd-measure's calculation from the section files. systemd-measure also extends the
// boot-phase strings systemd-pcrphase would add later (masked in the node image): with an
// empty --phase it gives the value before any phase, and its "enter-initrd" value is that
// base extended by SHA-256("enter-initrd").
func TestPCR11AgainstSystemdMeasure(t *testing.T) {
	needTools(t)
	u := buildRealUKI(t)
	p, err := PredictUKI(u.rawUKI)
	require.NoError(t, err)
	base := p.Value(PCRKernelImage)
	assert.Equal(t, systemdMeasure(t, u, ""), base[:], "PCR 11 before any phase")
	enter := extend(base, sha256.Sum256([]byte("enter-initrd")))
	assert.Equal(t, systemdMeasure(t, u, "enter-initrd"), enter[:], "PCR 11 at enter-initrd")
}

// TestAuthenticodeAgainstPesign compares the Authenticode digests of real EFI binaries
// with pesign's, and checks that an osslsigncode signature (a certificate table appended,
// the security directory entry set) leaves the digest unchanged, as it must.
func TestAuthenticodeAgainstPesign(t *testing.T) {
	needTools(t)
	u := buildRealUKI(t)
	signed := signPE(t, bootPEPath)
	for name, path := range map[string]string{
		"systemd-stub":         stubPath,
		"systemd-boot":         bootPEPath,
		"UKI":                  u.path,
		"systemd-boot, signed": signed,
	} {
		t.Run(name, func(t *testing.T) {
			raw, err := os.ReadFile(path)
			require.NoError(t, err)
			got, err := AuthenticodeSHA256(raw)
			require.NoError(t, err)
			assert.Equal(t, pesignDigest(t, path), hex.EncodeToString(got[:]))
		})
	}
	// The digest the signer put into the signature (osslsigncode pads the file to 8 bytes
	// before appending the certificate table, so it is the digest of the padded image).
	signedRaw, err := os.ReadFile(signed)
	require.NoError(t, err)
	b, err := AuthenticodeSHA256(signedRaw)
	require.NoError(t, err)
	msg, err := exec.Command("osslsigncode", "verify", "-in", signed).CombinedOutput()
	require.NotEmpty(t, msg, "osslsigncode verify: %v", err) // it fails on the untrusted test CA, after printing the digests
	m := regexp.MustCompile(`Current message digest\s*:\s*([0-9A-F]{64})`).FindSubmatch(msg)
	require.NotNil(t, m, "osslsigncode verify output: %s", msg)
	assert.Equal(t, strings.ToLower(string(m[1])), hex.EncodeToString(b[:]))

	// PCR 4's kernel event is the digest of the .linux section as systemd-stub hands it
	// to LoadImage.
	p, err := PredictUKI(u.rawUKI)
	require.NoError(t, err)
	assert.Equal(t, pesignDigest(t, bootPEPath), hex.EncodeToString(p.Events[PCRBootManagerCode][3].Digest[:]))
	assert.Equal(t, pesignDigest(t, u.path), hex.EncodeToString(p.Events[PCRBootManagerCode][2].Digest[:]))
}

func pesignDigest(t *testing.T, path string) string {
	t.Helper()
	out, err := exec.Command("pesign", "-h", "-i", path).CombinedOutput()
	require.NoError(t, err, "pesign: %s", out)
	f := strings.Fields(string(out))
	require.Len(t, f, 2, "pesign output: %s", out)
	return f[1]
}

// signPE signs a copy of path with a throw-away key and returns the copy's path.
func signPE(t *testing.T, path string) string {
	t.Helper()
	dir := t.TempDir()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "measuredboot test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageCodeSigning}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	certPath, keyPath, out := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem"), filepath.Join(dir, "signed.efi")
	require.NoError(t, os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600))
	msg, err := exec.Command("osslsigncode", "sign", "-certs", certPath, "-key", keyPath, "-h", "sha256", "-in", path, "-out", out).CombinedOutput()
	require.NoError(t, err, "osslsigncode: %s", msg)
	return out
}
