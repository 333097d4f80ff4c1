// Package volumestore is the local provider's storage of movable volumes (docs/local-provider.md
// "Volumes"), the host side of csidriver.Backing: each volume is a sparse file <id>.img of its
// size in one directory of the host (the provider's <workspace>/mini/volumes), outside every
// node's state storage, and a record <id>.json of its size and attachment. The host keeps only
// what the node writes into the file: ciphertext, encrypted inside the node with the volume's
// key.
//
// The record is the volume's commit point. Create writes the backing file first (a synced
// temporary file renamed into place), then the record (atomically, synced); Delete removes the
// record first, then the file. So a provider killed at any step leaves either no volume (maybe
// a backing file without record, never handed to any node: replaced by the next Create of that
// id, removed by a retried Delete or by the next Open) or a whole volume, which a retried
// Create adopts. Expand grows the file first, then the record; a file larger than its record
// is what a killed Expand leaves, and the retried Expand finishes.
//
// One Store per directory and process: a mutex orders every change.
package volumestore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/openconstellation/constellation/internal/csidriver"
	"github.com/openconstellation/constellation/internal/fileutil"
	"github.com/openconstellation/constellation/pkg/strictjson"
)

// MaxBytes bounds a volume's size: 1 TiB. The files are sparse (a size costs nothing until a
// node writes), but a size beyond what the host's file system holds would fail only when a
// node writes, long after the claim was bound.
const MaxBytes int64 = 1 << 40

// maxRecord bounds a record file: an id, a size and a node name.
const maxRecord = 4 << 10

// File name suffixes of a volume.
const (
	imageSuffix  = ".img"
	recordSuffix = ".json"
)

// Store keeps the volumes of one directory.
type Store struct {
	dir string
	mu  sync.Mutex
}

var _ csidriver.Backing = (*Store)(nil)

// record is a volume's <id>.json.
type record struct {
	ID         string `json:"id"`
	Bytes      int64  `json:"bytes"`
	AttachedTo string `json:"attachedTo"`
}

// Open returns the store of dir (an absolute path), creating the directory (mode 0700) if
// needed, and removes what killed operations left: temporary files and backing files without
// a record (never acknowledged, so never holding anything).
func Open(dir string) (*Store, error) {
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("volume store %q: want an absolute path", dir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("volume store: %w", err)
	}
	s := &Store{dir: filepath.Clean(dir)}
	if err := s.sweep(); err != nil {
		return nil, fmt.Errorf("volume store %s: %w", dir, err)
	}
	return s, nil
}

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

// sweep removes leftovers of killed operations (see the package comment).
func (s *Store) sweep() error {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		name := e.Name()
		var leftover bool
		switch {
		case strings.HasPrefix(name, ".vol-") && strings.HasSuffix(name, ".tmp"):
			leftover = true
		case strings.HasSuffix(name, imageSuffix) && csidriver.ValidID(strings.TrimSuffix(name, imageSuffix)):
			_, err := os.Lstat(s.recordPath(strings.TrimSuffix(name, imageSuffix)))
			leftover = errors.Is(err, os.ErrNotExist)
		}
		if leftover && e.Type().IsRegular() {
			if err := os.Remove(filepath.Join(s.dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return fileutil.SyncDir(s.dir)
}

// Create implements csidriver.Backing.
func (s *Store) Create(_ context.Context, id string, bytes int64) (csidriver.Volume, error) {
	if err := checkID(id); err != nil {
		return csidriver.Volume{}, err
	}
	if err := checkBytes(bytes); err != nil {
		return csidriver.Volume{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, err := s.read(id)
	switch {
	case err == nil:
		if rec.Bytes != bytes {
			return csidriver.Volume{}, fmt.Errorf("volume %s has %d bytes, not %d: %w", id, rec.Bytes, bytes, csidriver.ErrExists)
		}
		// A record without its file is not a volume to hand out again as empty: someone
		// removed the data, and a new zero file would hide that.
		if err := s.checkImage(id, rec.Bytes); err != nil {
			return csidriver.Volume{}, err
		}
		return rec.volume(), nil
	case !errors.Is(err, csidriver.ErrNotFound):
		return csidriver.Volume{}, err
	}
	if err := s.writeImage(id, bytes); err != nil {
		return csidriver.Volume{}, err
	}
	rec = record{ID: id, Bytes: bytes}
	if err := s.write(rec); err != nil {
		return csidriver.Volume{}, err
	}
	return rec.volume(), nil
}

// Get implements csidriver.Backing.
func (s *Store) Get(_ context.Context, id string) (csidriver.Volume, error) {
	if err := checkID(id); err != nil {
		return csidriver.Volume{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, err := s.read(id)
	if err != nil {
		return csidriver.Volume{}, err
	}
	return rec.volume(), nil
}

// Delete implements csidriver.Backing: the record first (from then on the volume does not
// exist), then the backing file.
func (s *Store) Delete(_ context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, err := s.read(id)
	switch {
	case errors.Is(err, csidriver.ErrNotFound):
		// Deleted already; a killed Delete may have left the file.
		return s.removeImage(id)
	case err != nil:
		return err
	case rec.AttachedTo != "":
		return fmt.Errorf("volume %s is attached to node %s: %w", id, rec.AttachedTo, csidriver.ErrAttached)
	}
	if err := os.Remove(s.recordPath(id)); err != nil {
		return fmt.Errorf("deleting volume %s: %w", id, err)
	}
	if err := fileutil.SyncDir(s.dir); err != nil {
		return err
	}
	return s.removeImage(id)
}

// Attach implements csidriver.Backing.
func (s *Store) Attach(_ context.Context, id, node string) error {
	if err := checkID(id); err != nil {
		return err
	}
	if err := CheckNode(node); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, err := s.read(id)
	if err != nil {
		return err
	}
	switch rec.AttachedTo {
	case node:
		return nil
	case "":
		rec.AttachedTo = node
		return s.write(rec)
	default:
		return &csidriver.AttachedElsewhereError{ID: id, Node: rec.AttachedTo}
	}
}

// Detach implements csidriver.Backing.
func (s *Store) Detach(_ context.Context, id, node string) error {
	if err := checkID(id); err != nil {
		return err
	}
	if err := CheckNode(node); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, err := s.read(id)
	switch {
	case errors.Is(err, csidriver.ErrNotFound):
		return nil
	case err != nil:
		return err
	case rec.AttachedTo != node:
		return nil
	}
	rec.AttachedTo = ""
	return s.write(rec)
}

// Expand implements csidriver.Backing: a request for no more than the volume's size leaves
// it as it is (a volume never shrinks) and returns its size.
func (s *Store) Expand(_ context.Context, id string, bytes int64) (int64, error) {
	if err := checkID(id); err != nil {
		return 0, err
	}
	if err := checkBytes(bytes); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, err := s.read(id)
	if err != nil {
		return 0, err
	}
	if bytes <= rec.Bytes {
		return rec.Bytes, nil
	}
	f, err := os.OpenFile(s.imagePath(id), os.O_WRONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("expanding volume %s: %w", id, err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("expanding volume %s: %w", id, err)
	}
	// A file larger than the request is what a killed Expand to a larger size left: keep it.
	if info.Size() < bytes {
		if err := f.Truncate(bytes); err != nil {
			return 0, fmt.Errorf("expanding volume %s: %w", id, err)
		}
		if err := f.Sync(); err != nil {
			return 0, fmt.Errorf("expanding volume %s: %w", id, err)
		}
	}
	rec.Bytes = bytes
	if err := s.write(rec); err != nil {
		return 0, err
	}
	return bytes, nil
}

// Path returns the backing file of the volume if it is attached to node; any other volume
// (attached elsewhere, detached, or none of that id) is an error wrapping
// csidriver.ErrNotAttached, so a node learns nothing of volumes that are not its own.
func (s *Store) Path(_ context.Context, id, node string) (string, error) {
	if err := checkID(id); err != nil {
		return "", err
	}
	if err := CheckNode(node); err != nil {
		return "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, err := s.read(id)
	if err != nil && !errors.Is(err, csidriver.ErrNotFound) {
		return "", err
	}
	if err != nil || rec.AttachedTo != node {
		return "", fmt.Errorf("volume %s, node %s: %w", id, node, csidriver.ErrNotAttached)
	}
	return s.imagePath(id), nil
}

// DetachNode releases every attachment of node, as a cloud detaches the disks of a deleted
// machine. It goes on past a volume it cannot change and returns every failure.
func (s *Store) DetachNode(node string) error {
	if err := CheckNode(node); err != nil {
		return err
	}
	return s.detachWhere(func(n string) bool { return n == node })
}

// DetachNodesExcept releases every attachment to a node not in nodes: what a provider killed
// between deleting a node and DetachNode left, released at its next start.
func (s *Store) DetachNodesExcept(nodes []string) error {
	return s.detachWhere(func(n string) bool { return !slices.Contains(nodes, n) })
}

// detachWhere releases every attachment to a node for which release is true.
func (s *Store) detachWhere(release func(node string) bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids, err := s.ids()
	if err != nil {
		return err
	}
	var errs []error
	for _, id := range ids {
		rec, err := s.read(id)
		if errors.Is(err, csidriver.ErrNotFound) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if rec.AttachedTo == "" || !release(rec.AttachedTo) {
			continue
		}
		rec.AttachedTo = ""
		if err := s.write(rec); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ids lists the volumes that have a record, by their file names.
func (s *Store) ids() ([]string, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("listing volumes: %w", err)
	}
	var ids []string
	for _, e := range entries {
		if id, ok := strings.CutSuffix(e.Name(), recordSuffix); ok && csidriver.ValidID(id) {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

func (s *Store) imagePath(id string) string  { return filepath.Join(s.dir, id+imageSuffix) }
func (s *Store) recordPath(id string) string { return filepath.Join(s.dir, id+recordSuffix) }

// read parses, verifies and checks the record of id; none is an error wrapping
// csidriver.ErrNotFound. Call with s.mu held.
func (s *Store) read(id string) (record, error) {
	f, err := os.OpenFile(s.recordPath(id), os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if errors.Is(err, os.ErrNotExist) {
		return record{}, fmt.Errorf("volume %s: %w", id, csidriver.ErrNotFound)
	}
	if err != nil {
		return record{}, fmt.Errorf("reading the record of volume %s: %w", id, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxRecord+1))
	if err != nil {
		return record{}, fmt.Errorf("reading the record of volume %s: %w", id, err)
	}
	if len(data) > maxRecord {
		return record{}, fmt.Errorf("the record of volume %s is larger than %d bytes", id, maxRecord)
	}
	var rec record
	if err := strictjson.Unmarshal(data, &rec); err != nil {
		return record{}, fmt.Errorf("the record of volume %s: %w", id, err)
	}
	if rec.ID != id {
		return record{}, fmt.Errorf("the record of volume %s names volume %q", id, rec.ID)
	}
	if err := checkBytes(rec.Bytes); err != nil {
		return record{}, fmt.Errorf("the record of volume %s: %w", id, err)
	}
	if rec.AttachedTo != "" {
		if err := CheckNode(rec.AttachedTo); err != nil {
			return record{}, fmt.Errorf("the record of volume %s: %w", id, err)
		}
	}
	return rec, nil
}

// write replaces the record of rec.ID atomically and durably. Call with s.mu held.
func (s *Store) write(rec record) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := fileutil.WriteAtomic(s.recordPath(rec.ID), append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("writing the record of volume %s: %w", rec.ID, err)
	}
	return nil
}

// writeImage makes the backing file of id: bytes of zeros (sparse), synced, renamed into
// place (replacing a file a killed Create left), the directory synced.
func (s *Store) writeImage(id string, bytes int64) error {
	f, err := os.CreateTemp(s.dir, "."+id+imageSuffix+".*.tmp")
	if err != nil {
		return fmt.Errorf("creating volume %s: %w", id, err)
	}
	tmp := f.Name()
	fail := func(err error) error {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("creating volume %s: %w", id, err)
	}
	if err := f.Truncate(bytes); err != nil {
		return fail(err)
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("creating volume %s: %w", id, err)
	}
	if err := os.Rename(tmp, s.imagePath(id)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("creating volume %s: %w", id, err)
	}
	return fileutil.SyncDir(s.dir)
}

// checkImage verifies that the backing file of a recorded volume is a regular file of at
// least its size.
func (s *Store) checkImage(id string, bytes int64) error {
	info, err := os.Lstat(s.imagePath(id))
	if err != nil {
		return fmt.Errorf("volume %s has a record but no backing file: %w", id, err)
	}
	if !info.Mode().IsRegular() || info.Size() < bytes {
		return fmt.Errorf("volume %s: the backing file is not a regular file of %d bytes", id, bytes)
	}
	return nil
}

// removeImage removes the backing file of id, if any, durably.
func (s *Store) removeImage(id string) error {
	err := os.Remove(s.imagePath(id))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("deleting the backing file of volume %s: %w", id, err)
	}
	return fileutil.SyncDir(s.dir)
}

func (r record) volume() csidriver.Volume {
	return csidriver.Volume{ID: r.ID, Bytes: r.Bytes, AttachedTo: r.AttachedTo}
}

// checkID refuses an id that is not of csidriver.IDFor's form: no path is built from one.
func checkID(id string) error {
	if !csidriver.ValidID(id) {
		return fmt.Errorf("volume id %q: want vol- and 32 lower-case hex digits", id)
	}
	return nil
}

// checkBytes refuses a size that is not 1..MaxBytes.
func checkBytes(bytes int64) error {
	if bytes < 1 || bytes > MaxBytes {
		return fmt.Errorf("volume size %d: want 1..%d bytes", bytes, MaxBytes)
	}
	return nil
}

// CheckNode refuses a node name that is not a Kubernetes node name (a DNS subdomain).
func CheckNode(node string) error {
	if errs := validation.IsDNS1123Subdomain(node); len(errs) > 0 {
		return fmt.Errorf("node name %q: %s", node, strings.Join(errs, "; "))
	}
	return nil
}
