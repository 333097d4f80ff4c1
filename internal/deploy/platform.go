package deploy

import (
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"regexp"

	corev1 "k8s.io/api/core/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
)

// TPMKind is how the services reach the node's TPM.
type TPMKind string

// TPM kinds.
const (
	// TPMSocket is a TPM served on a Unix socket (a swtpm, the local provider's).
	TPMSocket TPMKind = "socket"
	// TPMDevice is the kernel's TPM resource manager, e.g. /dev/tpmrm0 (VMs, clouds).
	TPMDevice TPMKind = "device"
)

// PlatformFacts are what the services need of the node platform they run on (the node half
// of a provider, boot.Platform): its name, which the join service looks its metadata client
// up by (--platform), where that metadata is served, and where a node keeps its TPM and its
// measured-boot event log, which the join and verification services mount. deploy knows no
// platform: every node platform states these facts itself.
type PlatformFacts struct {
	// Name is the node platform's name in the provider catalog, e.g. "local".
	Name string
	// MetadataURL is the platform's metadata service (http or https), where the join service
	// looks nodes up and the volume driver's controller reaches the platform's volumes.
	MetadataURL string
	// TPM is the absolute path of the node's TPM: a socket or a device, as TPMKind says.
	TPM     string
	TPMKind TPMKind
	// EventLog is the absolute path of the node's TCG event log ("" for none), which the
	// services send with their evidence (verifiers replay it against the quoted PCRs).
	EventLog string
}

var platformName = regexp.MustCompile(`\A[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\z`)

// Validate names every problem of f.
func (f PlatformFacts) Validate() error {
	var problems []error
	if !platformName.MatchString(f.Name) {
		problems = append(problems, fmt.Errorf("platform name %q: want a lowercase DNS label", f.Name))
	}
	if u, err := url.Parse(f.MetadataURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		problems = append(problems, fmt.Errorf("platform metadata URL %q: want http(s)://host[:port]", f.MetadataURL))
	}
	if !filepath.IsAbs(f.TPM) || filepath.Clean(f.TPM) != f.TPM {
		problems = append(problems, fmt.Errorf("platform TPM path %q: want a clean absolute path", f.TPM))
	}
	if f.TPMKind != TPMSocket && f.TPMKind != TPMDevice {
		problems = append(problems, fmt.Errorf("platform TPM kind %q: want %s or %s", f.TPMKind, TPMSocket, TPMDevice))
	}
	if f.EventLog != "" && (!filepath.IsAbs(f.EventLog) || filepath.Clean(f.EventLog) != f.EventLog) {
		problems = append(problems, fmt.Errorf("platform event log path %q: want a clean absolute path or none", f.EventLog))
	}
	if len(problems) > 0 {
		return errors.Join(problems...)
	}
	return nil
}

// tpmFlag is the services' --tpm: unix:PATH for a socket, the path for a device.
func (f PlatformFacts) tpmFlag() string {
	if f.TPMKind == TPMSocket {
		return "unix:" + f.TPM
	}
	return f.TPM
}

// containerEventLog is where a service's container sees the node's event log. Not the
// node's own path: a machine's is in sysfs (/sys/kernel/security/...), below which the
// container runtime cannot create a mount point.
const containerEventLog = "/run/constellation/eventlog"

// attestationFlags are the TPM and event-log flags of a service that attests.
func (f PlatformFacts) attestationFlags() []string {
	flags := []string{"--tpm=" + f.tpmFlag()}
	if f.EventLog != "" {
		flags = append(flags, "--event-log="+containerEventLog)
	}
	return flags
}

// attestationVolumes are the host paths of the node's TPM and event log, mounted at the
// TPM's path and at containerEventLog in the container.
func (f PlatformFacts) attestationVolumes() []*corev1ac.VolumeApplyConfiguration {
	tpmType := corev1.HostPathSocket
	if f.TPMKind == TPMDevice {
		tpmType = corev1.HostPathCharDev
	}
	v := []*corev1ac.VolumeApplyConfiguration{
		corev1ac.Volume().WithName("tpm").WithHostPath(corev1ac.HostPathVolumeSource().WithPath(f.TPM).WithType(tpmType)),
	}
	if f.EventLog != "" {
		v = append(v, corev1ac.Volume().WithName("eventlog").WithHostPath(corev1ac.HostPathVolumeSource().WithPath(f.EventLog).WithType(corev1.HostPathFile)))
	}
	return v
}

func (f PlatformFacts) attestationMounts() []*corev1ac.VolumeMountApplyConfiguration {
	m := []*corev1ac.VolumeMountApplyConfiguration{corev1ac.VolumeMount().WithName("tpm").WithMountPath(f.TPM)}
	if f.EventLog != "" {
		m = append(m, corev1ac.VolumeMount().WithName("eventlog").WithMountPath(containerEventLog).WithReadOnly(true))
	}
	return m
}
