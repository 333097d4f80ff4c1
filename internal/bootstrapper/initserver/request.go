package initserver

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/openconstellation/constellation/api/init/initpb"
	"github.com/openconstellation/constellation/api/join/joinpb"
	"github.com/openconstellation/constellation/internal/clusterrecord"
	"github.com/openconstellation/constellation/internal/kms"
	"github.com/openconstellation/constellation/internal/registries"
	"github.com/openconstellation/constellation/pkg/attestation/choose"
	"github.com/openconstellation/constellation/pkg/untrusted"
)

// MeasurementSaltSize is the size of the measurement salt.
const MeasurementSaltSize = 32

// request is a checked InitRequest.
type request struct {
	master          kms.MasterSecret
	measurementSalt []byte
	clusterName     string
	version         string
	components      []*joinpb.KubernetesComponent
	sans            []string
	serviceCIDR     netip.Prefix // invalid when not given
	podCIDR         netip.Prefix // invalid when not given
	// attestation is what the join service admits nodes by; nil when the request has none.
	attestation *choose.Reference
	// registryMirrors are the cluster's registry mirrors (none: empty).
	registryMirrors registries.Mirrors
	// endpoint is the cluster's stable API endpoint (host:port, kubeadm's
	// controlPlaneEndpoint): the platform's load balancer, or this node's address where the
	// platform has none. From metadata, not from the request.
	endpoint string
}

var (
	hashPattern = regexp.MustCompile(`\Asha256:[0-9a-f]{64}\z`)
)

// parseRequest checks every field of req and names every problem at once. wantVersion, when
// set, is the only Kubernetes version this node's image can run.
func parseRequest(req *initpb.InitRequest, wantVersion string) (*request, error) {
	var problems []error
	bad := func(format string, args ...any) { problems = append(problems, fmt.Errorf(format, args...)) }

	r := &request{
		master:          kms.MasterSecret{Key: req.GetMasterSecret(), Salt: req.GetMasterSalt()},
		measurementSalt: req.GetMeasurementSalt(),
		clusterName:     req.GetClusterName(),
		version:         req.GetKubernetesVersion(),
		components:      req.GetKubernetesComponents(),
		sans:            req.GetApiServerCertSans(),
	}
	if err := r.master.Validate(); err != nil {
		problems = append(problems, err)
	}
	if len(r.measurementSalt) != MeasurementSaltSize {
		bad("measurement salt has %d bytes, want %d", len(r.measurementSalt), MeasurementSaltSize)
	}
	if errs := validation.IsDNS1123Label(r.clusterName); len(errs) > 0 {
		bad("cluster name %s: %v", untrusted.Quote(r.clusterName), errs)
	}
	switch {
	case !clusterrecord.IsKubernetesVersion(r.version):
		bad("kubernetes version %s is not of the form v1.X.Y", untrusted.Quote(r.version))
	case wantVersion != "" && r.version != wantVersion:
		bad("kubernetes version %s is not the version this node's image runs (%s)", r.version, wantVersion)
	}
	for i, c := range r.components {
		if c.GetName() == "" || c.GetUrl() == "" || c.GetInstallPath() == "" {
			bad("kubernetes component %d: name, url and install path are required", i)
		}
		if !hashPattern.MatchString(c.GetHash()) {
			bad("kubernetes component %s: hash %s is not sha256:<64 lower-case hex digits>", untrusted.Quote(c.GetName()), untrusted.Quote(c.GetHash()))
		}
	}
	for _, san := range r.sans {
		if _, err := netip.ParseAddr(san); err == nil {
			continue
		}
		if errs := validation.IsDNS1123Subdomain(san); len(errs) > 0 {
			bad("API server SAN %s is neither an IP address nor a DNS name: %v", untrusted.Quote(san), errs)
		}
	}
	var err error
	if s := req.GetServiceCidr(); s != "" {
		if r.serviceCIDR, err = parsePrefix(s); err != nil {
			bad("service CIDR: %w", err)
		}
	}
	if s := req.GetPodCidr(); s != "" {
		if r.podCIDR, err = parsePrefix(s); err != nil {
			bad("pod CIDR: %w", err)
		}
	}
	if r.serviceCIDR.IsValid() && r.podCIDR.IsValid() && r.serviceCIDR.Overlaps(r.podCIDR) {
		bad("service CIDR %s and pod CIDR %s overlap", r.serviceCIDR, r.podCIDR)
	}
	// The whole reference of the variant, checked by the record's rules (which AK roots and
	// which hardware block the variant needs) before anything is committed.
	if data := req.GetAttestationReference(); len(data) > 0 {
		ref, err := choose.DecodeReference(data)
		if err == nil {
			err = ref.ValidateForCluster()
		}
		if err != nil {
			bad("attestation configuration: %w", err)
		} else {
			r.attestation = &ref
		}
	}
	if r.registryMirrors, err = registries.Parse(req.GetRegistryMirrors()); err != nil {
		problems = append(problems, err)
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("invalid init request: %w", errors.Join(problems...))
	}
	return r, nil
}

func parsePrefix(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		// netip's error repeats the whole input.
		return netip.Prefix{}, fmt.Errorf("%s is not a CIDR prefix", untrusted.Quote(s))
	}
	if p != p.Masked() {
		return netip.Prefix{}, fmt.Errorf("%s has host bits set (network is %s)", s, p.Masked())
	}
	return p, nil
}
