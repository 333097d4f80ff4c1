package metadataclient

// Decoders of untrusted answers, for the fuzz target.
var (
	DecodeSelf        = decodeSelf
	DecodeNode        = decodeNode
	DecodeInstances   = decodeInstances
	DecodeEndpoints   = decodeEndpoints
	DecodeHash        = decodeHash
	DecodeAPIEndpoint = decodeAPIEndpoint
)
