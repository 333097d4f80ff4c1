package initserver

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/openconstellation/constellation/api/init/initpb"
	"github.com/openconstellation/constellation/api/join/joinpb"
)

// FuzzParseRequest feeds the checks of an init request with arbitrary wire bytes (what an
// authenticated but buggy or hostile CLI could send). Property: no panic, and whatever is
// accepted has the sizes and forms the rest of init relies on.
func FuzzParseRequest(f *testing.F) {
	good := &initpb.InitRequest{
		MasterSecret: bytes.Repeat([]byte{1}, 32), MasterSalt: bytes.Repeat([]byte{2}, 32),
		MeasurementSalt: bytes.Repeat([]byte{3}, 32), InitSecret: []byte("s"),
		ClusterName: "demo", KubernetesVersion: "v1.34.4",
		KubernetesComponents: []*joinpb.KubernetesComponent{{Name: "kubelet", Url: "file:///k", Hash: "sha256:" + strings.Repeat("ab", 32), InstallPath: "/usr/bin/kubelet"}},
		ApiServerCertSans:    []string{"a.example.com", "192.0.2.1"},
		ServiceCidr:          "10.96.0.0/12", PodCidr: "10.244.0.0/16",
	}
	seed, err := proto.Marshal(good)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add([]byte{})
	bad := proto.Clone(good).(*initpb.InitRequest)
	bad.ServiceCidr, bad.PodCidr = "10.0.0.0/8", "10.1.0.0/16"
	if seed, err = proto.Marshal(bad); err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	// Attestation configurations: a valid one, and loose reference sets the register rule
	// refuses (only PCR 0; PCR 11 warn-only; PCR 15 pinned).
	zero := `"` + strings.Repeat("00", 32) + `"`
	full := func(extra string) string {
		var regs []string
		for i := range 15 {
			reg := fmt.Sprintf("%q:%s", fmt.Sprint(i), zero)
			if i == 11 && extra == "warn11" {
				reg = `"11":{"expected":` + zero + `,"warnOnly":true}`
			}
			regs = append(regs, reg)
		}
		if extra == "pcr15" {
			regs = append(regs, `"15":`+zero)
		}
		return `[{"name":"a","measurements":{` + strings.Join(regs, ",") + `}}]`
	}
	for _, sets := range []string{full(""), `[{"name":"a","measurements":{"0":` + zero + `}}]`, full("warn11"), full("pcr15")} {
		att := proto.Clone(good).(*initpb.InitRequest)
		att.AttestationReference = []byte(`{"variant":"qemu-vtpm","measurements":` + sets + `,"akRoots":"-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"}`)
		if seed, err = proto.Marshal(att); err != nil {
			f.Fatal(err)
		}
		f.Add(seed)
	}
	// A hardware reference: refused on qemu-vtpm, required by the SEV-SNP variants.
	for _, v := range []string{"qemu-vtpm", "aws-sev-snp"} {
		att := proto.Clone(good).(*initpb.InitRequest)
		att.AttestationReference = []byte(`{"variant":"` + v + `","measurements":` + full("") + `,"snp":{"name":"milan","products":["Milan"]}}`)
		if seed, err = proto.Marshal(att); err != nil {
			f.Fatal(err)
		}
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var req initpb.InitRequest
		if proto.Unmarshal(data, &req) != nil {
			return
		}
		r, err := parseRequest(&req, "v1.34.4")
		if err != nil {
			return
		}
		if len(r.master.Key) != 32 || len(r.master.Salt) != 32 || len(r.measurementSalt) != MeasurementSaltSize {
			t.Fatalf("accepted wrong sizes: %d %d %d", len(r.master.Key), len(r.master.Salt), len(r.measurementSalt))
		}
		if r.version != "v1.34.4" || r.clusterName == "" {
			t.Fatalf("accepted version %q, name %q", r.version, r.clusterName)
		}
		for _, p := range []struct{ ok, masked bool }{{r.serviceCIDR.IsValid(), r.serviceCIDR == r.serviceCIDR.Masked()}, {r.podCIDR.IsValid(), r.podCIDR == r.podCIDR.Masked()}} {
			if p.ok && !p.masked {
				t.Fatal("accepted a CIDR with host bits")
			}
		}
		if r.attestation != nil {
			if err := r.attestation.ValidateForCluster(); err != nil {
				t.Fatalf("accepted an invalid attestation configuration: %v", err)
			}
		}
		if r.serviceCIDR.IsValid() && r.podCIDR.IsValid() && r.serviceCIDR.Overlaps(r.podCIDR) {
			t.Fatal("accepted overlapping networks")
		}
	})
}
