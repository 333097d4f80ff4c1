package local

import "github.com/openconstellation/constellation/internal/attestation/variant"

// variantForCertification: local nodes attest with qemu-vtpm.
var variantForCertification = variant.QEMUVTPM
