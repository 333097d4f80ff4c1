// Package tdx verifies Intel TDX attestation: the TD-quote core that every TDX variant
// uses (VerifyQuote, Quote.Validate, Reference) and the qemu-tdx variant (Validator,
// Issuer), whose evidence is a hardwarepb.TDX message holding a TD quote.
//
// # What a TD quote proves
//
// A TD (trust domain) asks the TDX module for a TDREPORT over 64 bytes of its choosing
// (REPORTDATA). The TDREPORT is MAC'ed with a key only the CPU holds: it can be checked on the
// same machine and nowhere else, so on its own it proves nothing to a remote verifier. The
// host's quoting enclave (QE) checks the MAC and signs the report's body with an attestation
// key; the QE's own report, signed by the platform's PCK key, binds that attestation key;
// Intel certifies the PCK key (PCK certificate, PCK platform/processor CA, Intel SGX Root
// CA). The result is a version 4 TD quote.
//
// The steps are separate, as in every validator of this tree:
//
//  1. Parse (ParseQuote): version 4 only, at most MaxQuoteSize bytes, every size field
//     checked to stay inside the quote before go-tdx-guest slices by it (its parser trusts
//     the QE auth data size; FuzzParseQuote found that), a panic in the parser turned into
//     attestation.ErrMalformed. Bytes after the signed data are signed by nothing and
//     dropped.
//  2. Verify (VerifyQuote, with go-tdx-guest's verify.TdxQuote): the quote's ECDSA
//     signature over header and body with the attestation key, the QE report's
//     REPORTDATA binding that key, the QE report's signature with the PCK certificate, the
//     PCK chain to the Intel SGX Root CA pinned in roots/ (fingerprint-checked at start),
//     the PCK CRL and root CA CRL, Intel's signed TCB info and QE identity, and the TCB
//     status of platform and QE (UpToDate only). Collateral comes from the shared cache
//     (pkg/attestation/collateral) by URL; it is never used past its next update, and a
//     document that cannot be refreshed is an unknown status (VerifyOptions.Revocation).
//     VerifyQuoteHoldingCollateral, what the validators use, returns the body once the
//     signatures and PCK chain verified and holds what the collateral says in the quote;
//     VerifyQuote returns it only when the collateral passed too.
//  3. Validate: Quote.Validate against a Reference (MRSEAM accepted, TD attributes and
//     XFAM exact, DEBUG never, minimum TEE_TCB_SVN, QE vendor, minimum QE/PCE SVN), then,
//     in the variant, REPORTDATA = attestation.ReportData(purpose, data) || 0^32 and the
//     measurement registers against the reference sets.
//  4. Quote.Claims gives the verdict of the collateral (an attestation.CollateralError) and
//     then the claims: last, so that a quote refused by the steps before is refused for
//     that, with or without collateral (docs/attestation.md "Verdict order").
//
// # What each check defends against
//
//   - Quote signature: a relay changing any body field (measurements, attributes,
//     REPORTDATA).
//   - QE report data and QE report signature: an attestation key that no genuine quoting
//     enclave holds (a key made up by the host).
//   - PCK chain to the pinned root: quotes from anything that is not a genuine Intel CPU,
//     including a chain carried in the quote that ends in a look-alike root.
//   - CRLs (PCK and root): keys Intel revoked, for example of a platform whose keys leaked.
//     Without fresh CRLs a verifier never learns of a revocation, so a stale CRL fails.
//   - TCB info and its status: platforms whose microcode or TDX module has known
//     vulnerabilities (their keys are genuine, so only Intel's TCB levels tell them apart);
//     QE identity: quoting enclaves that are outdated or not Intel's.
//   - Time: certificates and collateral are checked at one injected instant, so expired or
//     not yet valid documents are refused and tests are reproducible.
//   - MRSEAM: a TDX module other than the one Intel released for the platform firmware
//     (the module enforces the TD's isolation).
//   - TD attributes: DEBUG lets the host read and write the TD's memory and registers; a
//     debug TD is never accepted, whatever the reference says. Other attributes (for example
//     SEPT_VE_DISABLE, PKS, PERFMON) must be exactly as the reference requires.
//   - XFAM: extended CPU state the TD may use, which changes the TD's attack surface.
//   - TEE_TCB_SVN minimum: a floor of the verifier's own above Intel's UpToDate level.
//   - REPORTDATA binding: replay of a quote made for another purpose, another connection
//     or another nonce (attestation.ReportData separates purposes; the zero half leaves
//     no room for a second value).
//   - MRTD and RTMR0..2 against the reference sets: a TD that booted other firmware, kernel,
//     command line or initrd. RTMR3 is the cluster-ID register (see below), never pinned.
//
// # What TDX does not cover
//
//   - A TDREPORT alone (as inside Azure's HCL report) is MAC'ed, not signed: only a quote
//     over it can be verified remotely, and the quote's body must then equal the report's
//     fields (the azure-tdx variant checks that).
//   - Availability: the host can stop, pause or starve the TD at any time.
//   - The TD's inputs after launch: RTMRs measure only what firmware and kernel extend into
//     them; what runs later is covered only if something measures it.
//   - Physical attacks on memory integrity beyond what the CPU's memory encryption
//     resists, and side channels between the TD and the host.
//   - Freshness of the quote itself: a quote has no timestamp; freshness comes from the
//     verifier's nonce in REPORTDATA.
//   - Node identity: Intel certifies the CPU, not a node name or role, so a verified quote
//     never sets attestation.Verified.SignerCertified.
//
// # Registers of qemu-tdx
//
// Register 0 is MRTD (the TD's initial memory: the virtual firmware), registers 1..3 are
// RTMR0..2 (firmware configuration; boot loader and kernel; kernel command line and initrd),
// register 4 is RTMR3, which carries the cluster-ID marker (ClusterIDMarker: RTMRs extend
// with SHA-384, so the marker is the SHA-384 counterpart of attestation.ClusterIDMarker).
package tdx
