// Package azuretdx implements the azure-tdx attestation variant (see Variant's documentation
// in azuretdx.go for what is and is not checked).
package azuretdx
