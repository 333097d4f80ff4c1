// Command qemu-firmware records the firmware registers of the QEMU provider's machines
// (docs/measured-boot.md "Recording the firmware registers"): it boots one machine of the
// provider's shape from a node OS image, with the provider's own code (the local cluster
// provider on QEMU machines), takes the registers from the machine's attestation (a quote by
// an AK the provider certified, its event log replayed), checks that every register the
// image determines equals its prediction, and writes the firmware's registers as a record.
//
// Run as root (network namespaces), about 2-4 minutes under TCG:
//
//	go run ./hack/qemu-firmware -image _output/vm-image -out internal/measuredboot/firmware/NAME.json
package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/openconstellation/constellation/internal/attestation/akca"
	"github.com/openconstellation/constellation/internal/measuredboot"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider"
	"github.com/openconstellation/constellation/internal/provider/local/cluster"
	"github.com/openconstellation/constellation/internal/provider/local/sandbox"
	"github.com/openconstellation/constellation/internal/provider/qemu"
	"github.com/openconstellation/constellation/internal/provider/qemu/vm"
	"github.com/openconstellation/constellation/pkg/atls"
	"github.com/openconstellation/constellation/pkg/attestation"
	"github.com/openconstellation/constellation/pkg/attestation/measurements"
	qemuvariant "github.com/openconstellation/constellation/pkg/attestation/qemu"
)

func main() {
	image := flag.String("image", "_output/vm-image", "node OS image folder (make vm-image)")
	work := flag.String("work", "_output/qemu-firmware", "work folder (replaced)")
	out := flag.String("out", "", "record file to write (default: print it)")
	timeout := flag.Duration("timeout", 10*time.Minute, "how long the boot may take")
	flag.Parse()
	log.SetFlags(0)
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	rec, err := record(ctx, *image, *work)
	if err != nil {
		log.Fatalf("qemu-firmware: %v", err)
	}
	data, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		log.Fatal(err)
	}
	data = append(data, '\n')
	if *out == "" {
		os.Stdout.Write(data)
		return
	}
	if err := os.WriteFile(*out, data, 0o644); err != nil {
		log.Fatal(err)
	}
	log.Printf("qemu-firmware: wrote %s", *out)
}

func record(ctx context.Context, imageDir, work string) (measuredboot.FirmwareRecord, error) {
	imageDir, err := filepath.Abs(imageDir)
	if err != nil {
		return measuredboot.FirmwareRecord{}, err
	}
	uki, err := os.ReadFile(filepath.Join(imageDir, qemu.UKIFile))
	if err != nil {
		return measuredboot.FirmwareRecord{}, err
	}
	disk, err := os.Open(filepath.Join(imageDir, qemu.DiskFile))
	if err != nil {
		return measuredboot.FirmwareRecord{}, err
	}
	defer disk.Close()
	prediction, err := measuredboot.PredictImage(uki, disk)
	if err != nil {
		return measuredboot.FirmwareRecord{}, err
	}
	shape := qemu.DefaultShape
	var why string
	shape.Accel, why = vm.DetectAccel()
	log.Printf("qemu-firmware: %s", why)

	observed, err := bootAndQuote(ctx, imageDir, work, shape)
	if err != nil {
		return measuredboot.FirmwareRecord{}, err
	}
	// The image's registers must be the predicted ones: otherwise the boot was not the
	// pinned one, and its firmware registers are not the ones to record.
	var wrong []string
	clusterID, _ := qemuvariant.Variant.ClusterIDRegister()
	for _, r := range prediction.Registers() {
		if r == clusterID {
			continue // zero at boot, never in a reference set: the validator does not report it
		}
		want := prediction.Value(r)
		if got := observed[r]; string(got) != string(want[:]) {
			wrong = append(wrong, fmt.Sprintf("PCR %d: predicted %x, quoted %x", r, want, got))
		}
	}
	// IMA's boot aggregate, derived from the quoted 0..9.
	var first10 [10][32]byte
	for i := range first10 {
		copy(first10[i][:], observed[uint32(i)])
	}
	ima := measuredboot.PredictIMA(first10)
	imaPCR := [32]byte{}
	imaPCR = sha256.Sum256(append(imaPCR[:], ima.Digest[:]...))
	if got := observed[measuredboot.PCRIMA]; string(got) != string(imaPCR[:]) {
		wrong = append(wrong, fmt.Sprintf("PCR %d (IMA): derived %x, quoted %x", measuredboot.PCRIMA, imaPCR, got))
	}
	if len(wrong) > 0 {
		return measuredboot.FirmwareRecord{}, fmt.Errorf("the boot's image registers differ from the prediction, so its firmware registers are not recorded:\n  %s", strings.Join(wrong, "\n  "))
	}
	build, err := measuredboot.HashFirmware("ovmf", debianVersion("ovmf"), shape.Firmware.Code, shape.Firmware.VarsTemplate)
	if err != nil {
		return measuredboot.FirmwareRecord{}, err
	}
	rec := measuredboot.FirmwareRecord{
		Firmware: build,
		Shape:    vm.Spec{MemoryMiB: shape.MemoryMiB, CPUs: shape.CPUs, Accel: shape.Accel, NIC: &vm.NIC{}}.MeasuredShape(),
		Observed: measurements.M{},
		Source: fmt.Sprintf("hack/qemu-firmware, %s: one boot of node OS image %s (UKI sha256 %x) under %s; quote by an AK the provider certified, event log replayed; PCRs 4, 5, 9, 11 equal to their prediction",
			time.Now().UTC().Format("2006-01-02"), filepath.Base(imageDir), sha256.Sum256(uki), shape.Accel),
	}
	for _, r := range measuredboot.FirmwareRegisters {
		rec.Observed[r] = measurements.Measurement{Expected: observed[r]}
	}
	return rec, rec.Validate()
}

// bootAndQuote boots one control-plane machine with the provider's code and returns the
// registers of its verified attestation, taken from the init server's handshake.
func bootAndQuote(ctx context.Context, imageDir, work string, shape qemu.Shape) (map[uint32][]byte, error) {
	spec, caCert, err := writeSpec(imageDir, work, shape)
	if err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(work, "provider.log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	pctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- cluster.Serve(pctx, spec, slog.New(slog.NewJSONHandler(logf, nil))) }()
	defer func() {
		stop()
		<-served
	}()
	v, err := zeroValidator(caCert)
	if err != nil {
		return nil, err
	}
	return waitForQuote(ctx, spec.Dir, v, served)
}

// writeSpec makes a fresh work folder with a cluster spec of one control-plane machine of
// shape, its AK CA and init secret hash, and returns the spec and the CA's certificate.
func writeSpec(imageDir, work string, shape qemu.Shape) (cluster.Spec, []byte, error) {
	if err := os.RemoveAll(work); err != nil {
		return cluster.Spec{}, nil, err
	}
	dir, err := filepath.Abs(filepath.Join(work, "mini"))
	if err != nil {
		return cluster.Spec{}, nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return cluster.Spec{}, nil, err
	}
	ca, err := akca.New("qemu-firmware AK CA", time.Now(), 24*time.Hour)
	if err != nil {
		return cluster.Spec{}, nil, err
	}
	caCert, caKey, err := ca.PEM()
	if err != nil {
		return cluster.Spec{}, nil, err
	}
	spec := cluster.Spec{Dir: dir, NextIndex: 1, Machines: qemu.Name,
		AKCACert: filepath.Join(dir, "ak-ca.pem"), AKCAKey: filepath.Join(dir, "ak-ca-key.pem"),
		Nodes: []cluster.NodeSpec{{NodeSpec: provider.NodeSpec{Name: "cp-0", Role: metadata.ControlPlane, Image: imageDir}}},
	}
	if err := os.WriteFile(spec.AKCACert, caCert, 0o644); err != nil {
		return cluster.Spec{}, nil, err
	}
	if err := os.WriteFile(spec.AKCAKey, caKey, 0o600); err != nil {
		return cluster.Spec{}, nil, err
	}
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	hash, err := bcrypt.GenerateFromPassword(secret, bcrypt.MinCost)
	if err != nil {
		return cluster.Spec{}, nil, err
	}
	spec.InitSecretHash = string(hash)
	if spec.MachineShape, err = json.Marshal(shape); err != nil {
		return cluster.Spec{}, nil, err
	}
	return spec, caCert, nil
}

// zeroValidator checks qemu-vtpm evidence against an all-zero reference set: it verifies the
// quote's signature, the AK's certificate by caCert and the event log, then reports every
// register that is not zero as a mismatch (measurements.MismatchError) with its value.
func zeroValidator(caCert []byte) (attestation.Validator, error) {
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caCert)
	zero := measurements.M{}
	for _, r := range qemuvariant.Variant.ImageRegisters() {
		zero[r] = measurements.Measurement{Expected: make([]byte, 32)}
	}
	return qemuvariant.NewValidator(qemuvariant.ValidatorConfig{
		ValidatorCommon: attestation.ValidatorCommon{ReferenceSets: measurements.ReferenceSets{{Name: "zero", Measurements: zero}}},
		AKRoots:         roots,
	})
}

// waitForQuote dials the machine's init server every 5 s, printing its console's last line,
// until a handshake's evidence verified, and returns its registers.
func waitForQuote(ctx context.Context, dir string, v attestation.Validator, served <-chan error) (map[uint32][]byte, error) {
	creds, err := atls.NewCredentials(atls.Config{Validators: []attestation.Validator{v}})
	if err != nil {
		return nil, err
	}
	bridge := sandbox.NSPath(sandbox.Network{ID: cluster.NetworkID(dir)}.BridgeNS())
	addr := net.JoinHostPort(sandbox.NodeAddr(0).String(), fmt.Sprint(cluster.InitPort))
	console := filepath.Join(dir, "nodes", "cp-0", vm.ConsoleFile)
	start := time.Now()
	for {
		select {
		case err := <-served:
			return nil, fmt.Errorf("the provider stopped: %w", err)
		default:
		}
		if raw, err := sandbox.DialContext(ctx, bridge, "tcp", addr); err == nil {
			_, herr := creds.Client(ctx, raw)
			raw.Close()
			if herr == nil {
				return nil, errors.New("the machine's registers are all zero: nothing measured its boot")
			}
			var mismatch *measurements.MismatchError
			if !errors.As(herr, &mismatch) {
				return nil, fmt.Errorf("the machine's attestation did not verify: %w", herr)
			}
			log.Printf("qemu-firmware: quote verified after %s", time.Since(start).Round(time.Second))
			return registersOf(mismatch), nil
		}
		last := lastLine(console)
		log.Printf("qemu-firmware: %s: waiting for the machine's init server at %s; console: %s", time.Since(start).Round(time.Second), addr, last)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for the machine's init server: %w; console ends: %s", ctx.Err(), last)
		case <-time.After(5 * time.Second):
		}
	}
}

// registersOf are the quoted image registers: zero unless the all-zero set's mismatch names them.
func registersOf(mismatch *measurements.MismatchError) map[uint32][]byte {
	regs := map[uint32][]byte{}
	for _, r := range qemuvariant.Variant.ImageRegisters() {
		regs[r] = make([]byte, 32)
	}
	for _, m := range mismatch.Mismatches {
		regs[m.Index] = m.Actual
	}
	return regs
}

func lastLine(path string) string {
	data, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	lines = slices.DeleteFunc(lines, func(s string) bool { return strings.TrimSpace(s) == "" })
	if len(lines) == 0 {
		return "(empty)"
	}
	l := lines[len(lines)-1]
	if len(l) > 160 {
		l = l[:160]
	}
	return strings.ToValidUTF8(l, "?")
}

// debianVersion is the installed version of a Debian package.
func debianVersion(pkg string) string {
	out, err := execOutput("dpkg-query", "-W", "-f=${Version}", pkg)
	if err != nil {
		return "unknown"
	}
	return out
}

func execOutput(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).Output()
	return strings.TrimSpace(string(out)), err
}
