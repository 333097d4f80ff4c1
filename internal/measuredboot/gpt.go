package measuredboot

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"

	"github.com/google/go-eventlog/tcg"
)

// PCRGPT is the register the firmware measures the boot disk's partition table into.
const PCRGPT = 5

// Strings OVMF measures into PCR 5 around ExitBootServices (edk2 Tcg2Dxe).
const (
	exitBootServicesInvocation = "Exit Boot Services Invocation"
	exitBootServicesReturned   = "Exit Boot Services Returned with Success"
)

// The GPT's fixed facts (UEFI 2.10 section 5.3).
const (
	gptSectorSize    = 512 // QEMU's virtio-blk logical block size, as the provider attaches the image
	gptSignature     = "EFI PART"
	gptMinHeaderSize = 92
	gptMaxEntries    = 1024
	gptMinEntrySize  = 128
	gptMaxEntrySize  = 4096
)

// GPTEventData returns the UEFI_GPT_DATA structure the firmware measures for the disk it
// boots from (TCG PC Client Platform Firmware Profile, EV_EFI_GPT_EVENT; edk2's
// Tcg2MeasureGptTable): the primary header's HeaderSize bytes, the number of used
// partition entries as a UINT64, then each used entry (a non-zero type GUID) in table
// order, SizeOfPartitionEntry bytes each. The header's and the entry array's CRC32s are
// checked first, as the firmware does before it measures.
func GPTEventData(disk io.ReaderAt) ([]byte, error) {
	hdr := make([]byte, gptSectorSize)
	if _, err := disk.ReadAt(hdr, gptSectorSize); err != nil {
		return nil, fmt.Errorf("reading the GPT header at LBA 1: %w", err)
	}
	if string(hdr[:8]) != gptSignature {
		return nil, errors.New("no GPT header at LBA 1 (signature is not \"EFI PART\")")
	}
	headerSize := binary.LittleEndian.Uint32(hdr[12:])
	if headerSize < gptMinHeaderSize || headerSize > gptSectorSize {
		return nil, fmt.Errorf("GPT header size %d is outside [%d, %d]", headerSize, gptMinHeaderSize, gptSectorSize)
	}
	header := bytes.Clone(hdr[:headerSize])
	wantCRC := binary.LittleEndian.Uint32(header[16:])
	binary.LittleEndian.PutUint32(header[16:], 0)
	if got := crc32.ChecksumIEEE(header); got != wantCRC {
		return nil, fmt.Errorf("GPT header CRC32 is %08x, the header says %08x", got, wantCRC)
	}
	binary.LittleEndian.PutUint32(header[16:], wantCRC)

	entriesLBA := binary.LittleEndian.Uint64(header[72:])
	count := binary.LittleEndian.Uint32(header[80:])
	entrySize := binary.LittleEndian.Uint32(header[84:])
	switch {
	case count == 0 || count > gptMaxEntries:
		return nil, fmt.Errorf("GPT has %d partition entries, want 1..%d", count, gptMaxEntries)
	case entrySize < gptMinEntrySize || entrySize > gptMaxEntrySize || entrySize%gptMinEntrySize != 0:
		return nil, fmt.Errorf("GPT partition entry size %d is not a multiple of %d up to %d", entrySize, gptMinEntrySize, gptMaxEntrySize)
	case entriesLBA < 2 || entriesLBA > 1<<40:
		return nil, fmt.Errorf("GPT partition entries at LBA %d", entriesLBA)
	}
	entries := make([]byte, int(count)*int(entrySize))
	if _, err := disk.ReadAt(entries, int64(entriesLBA)*gptSectorSize); err != nil {
		return nil, fmt.Errorf("reading %d GPT partition entries at LBA %d: %w", count, entriesLBA, err)
	}
	if got, want := crc32.ChecksumIEEE(entries), binary.LittleEndian.Uint32(header[88:]); got != want {
		return nil, fmt.Errorf("GPT partition entry array CRC32 is %08x, the header says %08x", got, want)
	}

	var used [][]byte
	zeroGUID := make([]byte, 16)
	for i := 0; i < int(count); i++ {
		e := entries[i*int(entrySize) : (i+1)*int(entrySize)]
		if !bytes.Equal(e[:16], zeroGUID) {
			used = append(used, e)
		}
	}
	out := append(header, binary.LittleEndian.AppendUint64(nil, uint64(len(used)))...)
	for _, e := range used {
		out = append(out, e...)
	}
	return out, nil
}

// PredictPCR5 predicts the firmware's PCR 5 when it boots from disk (OVMF 2022.11, the
// QEMU provider's pinned boot):
//   - EV_SEPARATOR, four zero bytes (at ReadyToBoot);
//   - EV_EFI_GPT_EVENT, the boot disk's partition table (GPTEventData), measured when the
//     firmware loads the UKI from it;
//   - EV_EFI_ACTION "Exit Boot Services Invocation" and "Exit Boot Services Returned with
//     Success" (the kernel's EFI stub leaves boot services).
//
// The partition table is the image's (its GUIDs derive from the root hash), so PCR 5 is
// predicted with the image, not observed with the firmware.
func PredictPCR5(disk io.ReaderAt) ([]Event, error) {
	gpt, err := GPTEventData(disk)
	if err != nil {
		return nil, fmt.Errorf("the boot disk's partition table: %w", err)
	}
	return []Event{
		{PCR: PCRGPT, Type: tcg.Separator, Digest: sha256.Sum256(make([]byte, 4)), Description: "separator (end of pre-boot measurements)"},
		{PCR: PCRGPT, Type: tcg.EFIGPTEvent, Digest: sha256.Sum256(gpt), Description: fmt.Sprintf("boot disk GPT (%d bytes)", len(gpt))},
		{PCR: PCRGPT, Type: tcg.EFIAction, Digest: sha256.Sum256([]byte(exitBootServicesInvocation)), Description: exitBootServicesInvocation},
		{PCR: PCRGPT, Type: tcg.EFIAction, Digest: sha256.Sum256([]byte(exitBootServicesReturned)), Description: exitBootServicesReturned},
	}, nil
}
