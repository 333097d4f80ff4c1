package vtpm

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"
)

// AKRootsNVIndex holds the platform's AK CA certificate (DER): the root a node checks other
// nodes' attestation keys against (the join service's, when the node joins). It lies in the
// platform manufacturer's range next to the AK certificates, but unlike them it is
// platform-created and write-locked (WritePlatformNV): a node trusts only what its own
// software cannot have written. See docs/local-provider.md, "TPM NV indices".
const AKRootsNVIndex = 0x01c10100

// platformNVAttributes: written with platform authorization only (PPWRITE), locked for good
// after the write (WRITEDEFINE + TPM2_NV_WriteLock: the lock survives reboots and ends only
// when the index is deleted, which for a platform-created index needs platform
// authorization too), readable by anyone on the node (OWNERREAD, AUTHREAD with empty auth).
const platformNVAttributes = tpm2.AttrPPWrite | tpm2.AttrWriteDefine | tpm2.AttrPPRead |
	tpm2.AttrOwnerRead | tpm2.AttrAuthRead | tpm2.AttrNoDA | tpm2.AttrPlatformCreate

// writeAttributes are every way an NV index can be written other than with platform
// authorization. A trusted index has none of them.
const writeAttributes = tpm2.AttrOwnerWrite | tpm2.AttrAuthWrite | tpm2.AttrPolicyWrite

// WritePlatformNV stores data in a platform-created NV index and write-locks it: what
// firmware does with values the node's software must be able to read but never change. It
// needs the platform hierarchy, which firmware disables before the node's software runs
// (DisablePlatformHierarchy). An index already holding data is kept; one holding other data
// is replaced (it can be: the platform hierarchy is enabled again at every TPM startup).
func (t *TPM) WritePlatformNV(index uint32, data []byte) error {
	if len(data) == 0 || len(data) > maxNVIndexSize {
		return fmt.Errorf("NV data of %d bytes: want 1..%d", len(data), maxNVIndexSize)
	}
	err := t.With(func(rw io.ReadWriter) error {
		h := tpmutil.Handle(index)
		if pub, err := tpm2.NVReadPublic(rw, h); err == nil {
			if pub.Attributes&(platformNVAttributes|tpm2.AttrWriteLocked|tpm2.AttrWritten) == platformNVAttributes|tpm2.AttrWriteLocked|tpm2.AttrWritten &&
				pub.Attributes&writeAttributes == 0 {
				if old, err := tpm2.NVReadEx(rw, h, tpm2.HandleOwner, "", 0); err == nil && bytes.Equal(old, data) {
					return nil
				}
			}
			// A platform-created index is deleted with platform authorization, an owner
			// one (planted while no platform value was there) with owner authorization.
			auth := tpm2.HandleOwner
			if pub.Attributes&tpm2.AttrPlatformCreate != 0 {
				auth = tpm2.HandlePlatform
			}
			if err := tpm2.NVUndefineSpace(rw, "", auth, h); err != nil {
				return fmt.Errorf("removing old NV index: %w", err)
			}
		}
		if err := tpm2.NVDefineSpace(rw, tpm2.HandlePlatform, h, "", "", nil, platformNVAttributes, uint16(len(data))); err != nil {
			return fmt.Errorf("defining NV index with platform authorization: %w", err)
		}
		for off := 0; off < len(data); off += maxNVWrite {
			end := min(off+maxNVWrite, len(data))
			if err := tpm2.NVWrite(rw, tpm2.HandlePlatform, h, "", data[off:end], uint16(off)); err != nil {
				return fmt.Errorf("writing NV index at offset %d: %w", off, err)
			}
		}
		if err := tpm2.NVWriteLock(rw, tpm2.HandlePlatform, h, ""); err != nil {
			return fmt.Errorf("write-locking NV index: %w", err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("platform NV index %#x on %s: %w", index, t.desc, err)
	}
	return nil
}

// cmdHierarchyControl is TPM_CC_HierarchyControl (go-tpm's legacy API has no wrapper).
const cmdHierarchyControl tpmutil.Command = 0x00000121

// DisablePlatformHierarchy disables the platform hierarchy until the next TPM startup, as
// firmware does before it hands the machine to the OS: from then on nobody can create,
// write or delete platform NV indices, so what WritePlatformNV stored stays as it is for
// this boot and every later one (the next boot's firmware disables it again).
func (t *TPM) DisablePlatformHierarchy() error {
	err := t.With(func(rw io.ReadWriter) error {
		// Disabled already in this boot (only a TPM reset enables it again), or held by the
		// firmware under an authorization nobody after it knows: done.
		if locked, err := platformHierarchyLocked(rw); err != nil || locked {
			return err
		}
		auth, err := tpmutil.Pack(tpm2.AuthCommand{Session: tpm2.HandlePasswordSession, Attributes: tpm2.AttrContinueSession, Auth: tpm2.EmptyAuth})
		if err != nil {
			return err
		}
		size, err := tpmutil.Pack(uint32(len(auth)))
		if err != nil {
			return err
		}
		// TPM2_HierarchyControl(authHandle=PLATFORM, enable=PLATFORM, state=NO).
		_, code, err := tpmutil.RunCommand(rw, tpm2.TagSessions, cmdHierarchyControl,
			tpm2.HandlePlatform, tpmutil.RawBytes(size), tpmutil.RawBytes(auth), tpm2.HandlePlatform, byte(0))
		if err != nil {
			return err
		}
		if code != tpmutil.RCSuccess {
			return fmt.Errorf("TPM2_HierarchyControl: response code %#x", uint32(code))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("disabling the platform hierarchy of %s: %w", t.desc, err)
	}
	return nil
}

// ErrUntrustedNV is returned by ReadPlatformNV for an index the node's own software could
// have written.
var ErrUntrustedNV = errors.New("NV index is not a write-locked platform index")

// phEnable is TPMA_STARTUP_CLEAR's platform hierarchy bit.
const phEnable = 1

// platformHierarchyEnabled reads phEnable of TPMA_STARTUP_CLEAR.
func platformHierarchyEnabled(rw io.ReadWriter) (bool, error) {
	props, _, err := tpm2.GetCapability(rw, tpm2.CapabilityTPMProperties, 1, uint32(tpm2.TPMAStartupClear))
	if err != nil {
		return false, fmt.Errorf("reading the hierarchy state: %w", err)
	}
	if len(props) != 1 {
		return false, errors.New("TPM did not report its hierarchy state")
	}
	prop, ok := props[0].(tpm2.TaggedProperty)
	if !ok || prop.Tag != tpm2.TPMAStartupClear {
		return false, errors.New("TPM did not report its hierarchy state")
	}
	return prop.Value&phEnable != 0, nil
}

// platformHierarchyLocked reports whether nothing on the node can use the platform hierarchy
// any more in this boot: it is disabled (TPM2_HierarchyControl; a sandbox's provider and a
// machine's image do it), or its authorization is not the empty one it has after every TPM
// reset, so the firmware set it to a value it kept to itself (OVMF's Tcg2PlatformDxe sets a
// random platformAuth at the end of boot and leaves the hierarchy enabled). Code that runs
// after the firmware finds the authorization empty or not, and cannot set it without knowing
// it: a node whose software sets it first is one whose firmware left it empty, and such a
// node's image disables the hierarchy before its first untrusted program runs.
//
// The authorization is probed without side effects: TPM2_PolicySecret with the platform
// hierarchy as the authorizing entity and the empty password, on a trial policy session
// that is flushed at once. TPM_RC_BAD_AUTH means the authorization is not empty.
func platformHierarchyLocked(rw io.ReadWriter) (bool, error) {
	enabled, err := platformHierarchyEnabled(rw)
	if err != nil || !enabled {
		return !enabled, err
	}
	session, _, err := tpm2.StartAuthSession(rw, tpm2.HandleNull, tpm2.HandleNull, make([]byte, 16), nil, tpm2.SessionTrial, tpm2.AlgNull, tpm2.AlgSHA256)
	if err != nil {
		return false, fmt.Errorf("probing the platform authorization: starting a trial session: %w", err)
	}
	defer func() { _ = tpm2.FlushContext(rw, session) }()
	_, _, err = tpm2.PolicySecret(rw, tpm2.HandlePlatform, tpm2.AuthCommand{Session: tpm2.HandlePasswordSession, Attributes: tpm2.AttrContinueSession, Auth: tpm2.EmptyAuth},
		session, nil, nil, nil, 0)
	var serr tpm2.SessionError
	switch {
	case err == nil:
		return false, nil // the empty authorization works: anyone on the node can use the hierarchy
	case errors.As(err, &serr) && serr.Code == tpm2.RCBadAuth:
		return true, nil
	default:
		return false, fmt.Errorf("probing the platform authorization: %w", err)
	}
}

// ReadPlatformNV reads an index WritePlatformNV wrote, and only such an index: it must be
// platform-created, written and write-locked, with no other way to write it, and the
// platform hierarchy must be disabled. Otherwise the node's own software (or a workload that
// took it over) could have put the value there, and it is worth nothing as a trust anchor.
func (t *TPM) ReadPlatformNV(index uint32) ([]byte, error) {
	var data []byte
	err := t.With(func(rw io.ReadWriter) error {
		locked, err := platformHierarchyLocked(rw)
		if err != nil {
			return err
		}
		if !locked {
			return fmt.Errorf("%w: the platform hierarchy is enabled with an empty authorization, so software on this node can still rewrite platform indices (firmware must disable it or set its authorization)", ErrUntrustedNV)
		}
		h := tpmutil.Handle(index)
		pub, err := tpm2.NVReadPublic(rw, h)
		if err != nil {
			return ErrNVNotDefined
		}
		want := tpm2.AttrPlatformCreate | tpm2.AttrWriteDefine | tpm2.AttrWriteLocked | tpm2.AttrWritten
		if pub.Attributes&want != want {
			return fmt.Errorf("%w: attributes %#x lack platform-create, write-define, write-locked or written", ErrUntrustedNV, uint32(pub.Attributes))
		}
		if pub.Attributes&writeAttributes != 0 {
			return fmt.Errorf("%w: attributes %#x allow writes without platform authorization", ErrUntrustedNV, uint32(pub.Attributes))
		}
		data, err = tpm2.NVReadEx(rw, h, tpm2.HandleOwner, "", 0)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("NV index %#x on %s: %w", index, t.desc, err)
	}
	return data, nil
}
