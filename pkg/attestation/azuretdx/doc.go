// Package azuretdx implements the azure-tdx attestation variant: a TPM 2.0 quote of the
// vTPM that Azure's paravisor (the HCL) runs inside a TDX confidential VM, plus the HCL report
// from the vTPM's NV index 0x1400001 (a TDREPORT binding the vTPM's attestation key) and a TD
// quote of that TDREPORT, which Azure's instance metadata service produces.
//
// What is checked: the TPM quote (signature by the AK, the nonce, the PCRs against the
// reference sets); the HCL report's layout (every size and offset); the TD quote's ECDSA
// signature, its quoting enclave's report and PCK chain to Intel's pinned root, CRLs and TCB
// status against Intel's signed, fresh TCB info and QE identity (tdx.VerifyQuote); that the
// TD quote's body repeats the TDREPORT's fields (TEE_TCB_SVN, MRSEAM, TD attributes, XFAM,
// MRTD, RTMR0..3, REPORTDATA), so the quote is of this TDREPORT; that REPORTDATA is SHA-256 of
// the runtime data followed by 32 zero bytes; that the runtime data's AK (HCLAkPub) is the key
// that signed the TPM quote; and the quote against the TDX reference (MRSEAM, attributes
// without DEBUG, XFAM, minimum TEE_TCB_SVN, QE vendor and SVNs). What is not checked: the
// TDREPORT is made when the VM boots, so freshness comes from the TPM quote's nonce alone;
// MRTD and the RTMRs are reported but not compared with reference values (Azure's paravisor
// and firmware measure into the vTPM's PCRs, which the reference sets pin); the runtime data's
// vm-configuration and EK are not used; the TDREPORT's MRSIGNERSEAM, SEAM attributes,
// MRCONFIGID, MROWNER and MROWNERCONFIG are not compared with the quote's (tdx.Quote does not
// expose them; no decision uses them).
package azuretdx
