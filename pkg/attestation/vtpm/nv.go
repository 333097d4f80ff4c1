package vtpm

import (
	"errors"
	"fmt"
	"io"

	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"
)

// AKCertNVIndex is the NV index where the platform stores the certificate of the node's RSA
// attestation key. It is the index Google's vTPMs use for the same purpose, so one reader works
// for the local provider and for a cloud that certifies AKs the same way.
const AKCertNVIndex = 0x01c10000

// AKCertNVIndexECC holds the certificate of the ECC P-256 attestation key (Google's index
// for the same purpose).
const AKCertNVIndexECC = 0x01c10002

// maxNVWrite is the largest chunk written per TPM2_NV_Write (TPM MAX_NV_BUFFER_SIZE is 1024
// on swtpm and typical chips; 512 is safe everywhere).
const maxNVWrite = 512

// maxNVIndexSize is the largest NV index a TPM is required to support in practice.
const maxNVIndexSize = 2048

// WriteNV stores data in an owner-readable NV index, replacing what was there.
func (t *TPM) WriteNV(index uint32, data []byte) error {
	if len(data) == 0 || len(data) > maxNVIndexSize {
		return fmt.Errorf("NV data of %d bytes: want 1..%d", len(data), maxNVIndexSize)
	}
	err := t.With(func(rw io.ReadWriter) error {
		h := tpmutil.Handle(index)
		// Replace an existing index: its size may differ.
		if _, err := tpm2.NVReadPublic(rw, h); err == nil {
			if err := tpm2.NVUndefineSpace(rw, "", tpm2.HandleOwner, h); err != nil {
				return fmt.Errorf("removing old NV index: %w", err)
			}
		}
		attrs := tpm2.AttrOwnerWrite | tpm2.AttrOwnerRead | tpm2.AttrNoDA
		if err := tpm2.NVDefineSpace(rw, tpm2.HandleOwner, h, "", "", nil, attrs, uint16(len(data))); err != nil {
			return fmt.Errorf("defining NV index: %w", err)
		}
		for off := 0; off < len(data); off += maxNVWrite {
			end := min(off+maxNVWrite, len(data))
			if err := tpm2.NVWrite(rw, tpm2.HandleOwner, h, "", data[off:end], uint16(off)); err != nil {
				return fmt.Errorf("writing NV index at offset %d: %w", off, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("NV index %#x on %s: %w", index, t.desc, err)
	}
	return nil
}

// ErrNVNotDefined is returned by ReadNV for an index that does not exist.
var ErrNVNotDefined = errors.New("NV index not defined")

// ReadNV reads a whole owner-readable NV index.
func (t *TPM) ReadNV(index uint32) ([]byte, error) {
	var data []byte
	err := t.With(func(rw io.ReadWriter) error {
		h := tpmutil.Handle(index)
		if _, err := tpm2.NVReadPublic(rw, h); err != nil {
			return ErrNVNotDefined
		}
		var err error
		data, err = tpm2.NVReadEx(rw, h, tpm2.HandleOwner, "", 0)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("NV index %#x on %s: %w", index, t.desc, err)
	}
	return data, nil
}
