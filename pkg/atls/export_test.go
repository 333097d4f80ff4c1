package atls

import "bytes"

// EphemeralCert is the certificate generation aTLS servers use, for the plain-TLS benchmark
// floor.
var EphemeralCert = ephemeralCert

// ExporterLabel is the exporter label of the evidence binding, for the benchmarks' limit.
const ExporterLabel = exporterLabel

// DecodeFramesForFuzzing decodes frames from data until it fails; it must never panic nor allocate
// beyond the limit.
func DecodeFramesForFuzzing(data []byte) {
	r := bytes.NewReader(data)
	for {
		if _, err := readFrame(r, maxHelloFrame); err != nil {
			return
		}
	}
}
