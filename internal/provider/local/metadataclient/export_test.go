package metadataclient

// Decoders of untrusted answers, for the fuzz target.
var (
	DecodeSelf      = decodeSelf
	DecodeInstances = decodeInstances
	DecodeEndpoints = decodeEndpoints
	DecodeHash      = decodeHash
)
