package volumestore_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openconstellation/constellation/internal/csidriver"
	"github.com/openconstellation/constellation/internal/provider/local/volumestore"
)

var (
	idA = csidriver.IDFor("pvc-a")
	idB = csidriver.IDFor("pvc-b")
)

const mib = 1 << 20

func open(t *testing.T) (*volumestore.Store, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "volumes")
	s, err := volumestore.Open(dir)
	require.NoError(t, err)
	return s, dir
}

// TestOperations runs each case on a fresh store prepared by setup.
func TestOperations(t *testing.T) {
	ctx := context.Background()
	created := func(t *testing.T, s *volumestore.Store) {
		_, err := s.Create(ctx, idA, mib)
		require.NoError(t, err)
	}
	attachedTo := func(node string) func(*testing.T, *volumestore.Store) {
		return func(t *testing.T, s *volumestore.Store) {
			created(t, s)
			require.NoError(t, s.Attach(ctx, idA, node))
		}
	}
	for name, tc := range map[string]struct {
		setup   func(*testing.T, *volumestore.Store)
		op      func(*volumestore.Store) (any, error)
		want    any
		wantErr error  // errors.Is
		errText string // or a message part
		after   csidriver.Volume
		gone    bool // no volume afterwards
	}{
		"create": {
			op:    func(s *volumestore.Store) (any, error) { return s.Create(ctx, idA, mib) },
			want:  csidriver.Volume{ID: idA, Bytes: mib},
			after: csidriver.Volume{ID: idA, Bytes: mib},
		},
		"create again, same size: the existing volume": {
			setup: attachedTo("worker-0"),
			op:    func(s *volumestore.Store) (any, error) { return s.Create(ctx, idA, mib) },
			want:  csidriver.Volume{ID: idA, Bytes: mib, AttachedTo: "worker-0"},
			after: csidriver.Volume{ID: idA, Bytes: mib, AttachedTo: "worker-0"},
		},
		"create again, other size": {
			setup: created, op: func(s *volumestore.Store) (any, error) { return s.Create(ctx, idA, 2*mib) },
			wantErr: csidriver.ErrExists, after: csidriver.Volume{ID: idA, Bytes: mib},
		},
		"create: bad id": {
			op:      func(s *volumestore.Store) (any, error) { return s.Create(ctx, "../../etc/passwd", mib) },
			errText: "want vol- and 32", gone: true,
		},
		"create: size 0": {
			op: func(s *volumestore.Store) (any, error) { return s.Create(ctx, idA, 0) }, errText: "volume size 0", gone: true,
		},
		"create: too large": {
			op: func(s *volumestore.Store) (any, error) { return s.Create(ctx, idA, volumestore.MaxBytes+1) }, errText: "want 1..", gone: true,
		},
		"get: none": {
			op: func(s *volumestore.Store) (any, error) { return s.Get(ctx, idA) }, wantErr: csidriver.ErrNotFound, gone: true,
		},
		"delete": {
			setup: created, op: func(s *volumestore.Store) (any, error) { return nil, s.Delete(ctx, idA) }, gone: true,
		},
		"delete: none is deleted already": {
			op: func(s *volumestore.Store) (any, error) { return nil, s.Delete(ctx, idA) }, gone: true,
		},
		"delete: attached": {
			setup: attachedTo("worker-0"), op: func(s *volumestore.Store) (any, error) { return nil, s.Delete(ctx, idA) },
			wantErr: csidriver.ErrAttached, after: csidriver.Volume{ID: idA, Bytes: mib, AttachedTo: "worker-0"},
		},
		"attach": {
			setup: created, op: func(s *volumestore.Store) (any, error) { return nil, s.Attach(ctx, idA, "worker-0") },
			after: csidriver.Volume{ID: idA, Bytes: mib, AttachedTo: "worker-0"},
		},
		"attach: to the same node again": {
			setup: attachedTo("worker-0"), op: func(s *volumestore.Store) (any, error) { return nil, s.Attach(ctx, idA, "worker-0") },
			after: csidriver.Volume{ID: idA, Bytes: mib, AttachedTo: "worker-0"},
		},
		"attach: held by another node": {
			setup: attachedTo("worker-0"), op: func(s *volumestore.Store) (any, error) { return nil, s.Attach(ctx, idA, "worker-1") },
			wantErr: &csidriver.AttachedElsewhereError{ID: idA, Node: "worker-0"},
			after:   csidriver.Volume{ID: idA, Bytes: mib, AttachedTo: "worker-0"},
		},
		"attach: none": {
			op: func(s *volumestore.Store) (any, error) { return nil, s.Attach(ctx, idA, "worker-0") }, wantErr: csidriver.ErrNotFound, gone: true,
		},
		"attach: bad node name": {
			setup: created, op: func(s *volumestore.Store) (any, error) { return nil, s.Attach(ctx, idA, "Worker/0") },
			errText: `node name "Worker/0"`, after: csidriver.Volume{ID: idA, Bytes: mib},
		},
		"detach": {
			setup: attachedTo("worker-0"), op: func(s *volumestore.Store) (any, error) { return nil, s.Detach(ctx, idA, "worker-0") },
			after: csidriver.Volume{ID: idA, Bytes: mib},
		},
		"detach: from a node that does not hold it": {
			setup: attachedTo("worker-0"), op: func(s *volumestore.Store) (any, error) { return nil, s.Detach(ctx, idA, "worker-1") },
			after: csidriver.Volume{ID: idA, Bytes: mib, AttachedTo: "worker-0"},
		},
		"detach: none": {
			op: func(s *volumestore.Store) (any, error) { return nil, s.Detach(ctx, idA, "worker-0") }, gone: true,
		},
		"expand": {
			setup: attachedTo("worker-0"), op: func(s *volumestore.Store) (any, error) { return s.Expand(ctx, idA, 3*mib) },
			want: int64(3 * mib), after: csidriver.Volume{ID: idA, Bytes: 3 * mib, AttachedTo: "worker-0"},
		},
		"expand: smaller never shrinks": {
			setup: created, op: func(s *volumestore.Store) (any, error) { return s.Expand(ctx, idA, mib/2) },
			want: int64(mib), after: csidriver.Volume{ID: idA, Bytes: mib},
		},
		"expand: none": {
			op: func(s *volumestore.Store) (any, error) { return s.Expand(ctx, idA, mib) }, wantErr: csidriver.ErrNotFound, gone: true,
		},
		"path: attached to the node": {
			setup: attachedTo("worker-0"), op: func(s *volumestore.Store) (any, error) {
				p, err := s.Path(context.Background(), idA, "worker-0")
				return filepath.Base(p), err
			},
			want: idA + ".img", after: csidriver.Volume{ID: idA, Bytes: mib, AttachedTo: "worker-0"},
		},
		"path: attached to another node": {
			setup: attachedTo("worker-0"), op: func(s *volumestore.Store) (any, error) { return s.Path(context.Background(), idA, "worker-1") },
			wantErr: csidriver.ErrNotAttached, after: csidriver.Volume{ID: idA, Bytes: mib, AttachedTo: "worker-0"},
		},
		"path: detached": {
			setup: created, op: func(s *volumestore.Store) (any, error) { return s.Path(context.Background(), idA, "worker-0") },
			wantErr: csidriver.ErrNotAttached, after: csidriver.Volume{ID: idA, Bytes: mib},
		},
		"path: none (not told apart from another node's)": {
			op: func(s *volumestore.Store) (any, error) { return s.Path(context.Background(), idA, "worker-0") }, wantErr: csidriver.ErrNotAttached, gone: true,
		},
		"detach node": {
			setup: attachedTo("worker-0"), op: func(s *volumestore.Store) (any, error) { return nil, s.DetachNode("worker-0") },
			after: csidriver.Volume{ID: idA, Bytes: mib},
		},
		"detach node: another node's volume stays": {
			setup: attachedTo("worker-0"), op: func(s *volumestore.Store) (any, error) { return nil, s.DetachNode("worker-1") },
			after: csidriver.Volume{ID: idA, Bytes: mib, AttachedTo: "worker-0"},
		},
		"detach nodes except: a node the provider no longer has": {
			setup: attachedTo("worker-0"), op: func(s *volumestore.Store) (any, error) {
				return nil, s.DetachNodesExcept([]string{"control-plane-0", "worker-1"})
			},
			after: csidriver.Volume{ID: idA, Bytes: mib},
		},
		"detach nodes except: a node it has": {
			setup: attachedTo("worker-0"), op: func(s *volumestore.Store) (any, error) {
				return nil, s.DetachNodesExcept([]string{"control-plane-0", "worker-0"})
			},
			after: csidriver.Volume{ID: idA, Bytes: mib, AttachedTo: "worker-0"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			s, dir := open(t)
			if tc.setup != nil {
				tc.setup(t, s)
			}
			got, err := tc.op(s)
			switch {
			case tc.wantErr != nil:
				var elsewhere *csidriver.AttachedElsewhereError
				if want, ok := tc.wantErr.(*csidriver.AttachedElsewhereError); ok {
					require.ErrorAs(t, err, &elsewhere)
					assert.Equal(t, want, elsewhere)
				} else {
					require.ErrorIs(t, err, tc.wantErr)
				}
			case tc.errText != "":
				require.ErrorContains(t, err, tc.errText)
			default:
				require.NoError(t, err)
				if tc.want != nil {
					assert.Equal(t, tc.want, got)
				}
			}
			v, err := s.Get(ctx, idA)
			if tc.gone {
				require.ErrorIs(t, err, csidriver.ErrNotFound)
				assert.NoFileExists(t, filepath.Join(dir, idA+".img"))
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.after, v)
			info, err := os.Stat(filepath.Join(dir, idA+".img"))
			require.NoError(t, err)
			assert.Equal(t, tc.after.Bytes, info.Size(), "the backing file has the volume's size")
		})
	}
}

func TestFilesOnDisk(t *testing.T) {
	ctx := context.Background()
	s, dir := open(t)
	_, err := s.Create(ctx, idA, 64*mib)
	require.NoError(t, err)
	require.NoError(t, s.Attach(ctx, idA, "worker-0"))

	// The backing file is sparse zeros of the size, readable by its owner only.
	info, err := os.Stat(filepath.Join(dir, idA+".img"))
	require.NoError(t, err)
	assert.Equal(t, int64(64*mib), info.Size())
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	assert.Less(t, info.Sys().(*syscall.Stat_t).Blocks*512, int64(mib), "sparse: no blocks for zeros")

	// The record: exactly the documented fields.
	data, err := os.ReadFile(filepath.Join(dir, idA+".json"))
	require.NoError(t, err)
	assert.JSONEq(t, `{"id":"`+idA+`","bytes":67108864,"attachedTo":"worker-0"}`, string(data))

	// Path: absolute, in the store's directory.
	p, err := s.Path(context.Background(), idA, "worker-0")
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dir, idA+".img"), p)

	// DetachNode releases only that node's volumes.
	_, err = s.Create(ctx, idB, mib)
	require.NoError(t, err)
	require.NoError(t, s.Attach(ctx, idB, "worker-1"))
	require.NoError(t, s.DetachNode("worker-0"))
	a, err := s.Get(ctx, idA)
	require.NoError(t, err)
	assert.Empty(t, a.AttachedTo)
	b, err := s.Get(ctx, idB)
	require.NoError(t, err)
	assert.Equal(t, "worker-1", b.AttachedTo)

	// Deletion removes the volume's two files and nothing else.
	require.NoError(t, s.Delete(ctx, idA))
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	assert.Equal(t, []string{idB + ".img", idB + ".json"}, names)
}

// TestKilledProvider lays out what a provider killed at each step leaves, and checks that a
// store opened on it (a restarted provider) and a retried request end in a whole volume or in
// none.
func TestKilledProvider(t *testing.T) {
	ctx := context.Background()
	rec := func(id string, bytes int64, node string) string {
		data, _ := json.Marshal(map[string]any{"id": id, "bytes": bytes, "attachedTo": node})
		return string(data)
	}
	for name, tc := range map[string]struct {
		files   map[string]string // name -> content ("" for a file of 1 MiB of zeros)
		retry   func(*volumestore.Store) error
		want    *csidriver.Volume // nil: no volume
		errText string
		left    []string // the directory's names afterwards
	}{
		"killed mid-create, before the rename: nothing": {
			files: map[string]string{"." + idA + ".img.123.tmp": ""},
			left:  nil,
		},
		"killed mid-create, before the record: nothing, and the retry creates": {
			files: map[string]string{idA + ".img": ""},
			retry: func(s *volumestore.Store) error { _, err := s.Create(ctx, idA, 2*mib); return err },
			want:  &csidriver.Volume{ID: idA, Bytes: 2 * mib},
			left:  []string{idA + ".img", idA + ".json"},
		},
		"killed while writing a record: the old record holds": {
			files: map[string]string{idA + ".img": "", idA + ".json": rec(idA, mib, ""), "." + idA + ".json.abcd.tmp": "{"},
			retry: func(s *volumestore.Store) error { _, err := s.Create(ctx, idA, mib); return err },
			want:  &csidriver.Volume{ID: idA, Bytes: mib},
			left:  []string{idA + ".img", idA + ".json"},
		},
		"killed mid-delete, after the record: nothing": {
			files: map[string]string{idA + ".img": ""},
			retry: func(s *volumestore.Store) error { return s.Delete(ctx, idA) },
			left:  nil,
		},
		"killed mid-expand, after the file: the retry finishes": {
			files: map[string]string{idA + ".img": "", idA + ".json": rec(idA, mib/2, "worker-0")},
			retry: func(s *volumestore.Store) error { _, err := s.Expand(ctx, idA, mib); return err },
			want:  &csidriver.Volume{ID: idA, Bytes: mib, AttachedTo: "worker-0"},
			left:  []string{idA + ".img", idA + ".json"},
		},
		"a record without its file is not handed out again as empty": {
			files:   map[string]string{idA + ".json": rec(idA, mib, "")},
			retry:   func(s *volumestore.Store) error { _, err := s.Create(ctx, idA, mib); return err },
			errText: "has a record but no backing file",
			want:    &csidriver.Volume{ID: idA, Bytes: mib},
			left:    []string{idA + ".json"},
		},
		"a record naming another volume fails closed": {
			files:   map[string]string{idA + ".img": "", idA + ".json": rec(idB, mib, "")},
			retry:   func(s *volumestore.Store) error { _, err := s.Get(ctx, idA); return err },
			errText: "names volume",
			left:    []string{idA + ".img", idA + ".json"},
		},
		"a record with a duplicate field fails closed": {
			files:   map[string]string{idA + ".img": "", idA + ".json": `{"id":"` + idA + `","bytes":1,"bytes":2,"attachedTo":""}`},
			retry:   func(s *volumestore.Store) error { return s.Attach(ctx, idA, "worker-0") },
			errText: "duplicate",
			left:    []string{idA + ".img", idA + ".json"},
		},
		"files of other names are left alone": {
			files: map[string]string{"notes.txt": "x", "vol-1.img": ""},
			left:  []string{"notes.txt", "vol-1.img"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "volumes")
			require.NoError(t, os.Mkdir(dir, 0o700))
			for n, content := range tc.files {
				if content == "" {
					f, err := os.Create(filepath.Join(dir, n))
					require.NoError(t, err)
					require.NoError(t, f.Truncate(mib))
					require.NoError(t, f.Close())
					continue
				}
				require.NoError(t, os.WriteFile(filepath.Join(dir, n), []byte(content), 0o600))
			}
			s, err := volumestore.Open(dir)
			require.NoError(t, err)
			if tc.retry != nil {
				err := tc.retry(s)
				if tc.errText != "" {
					require.ErrorContains(t, err, tc.errText)
				} else {
					require.NoError(t, err)
				}
			}
			if tc.want != nil {
				v, err := s.Get(ctx, idA)
				require.NoError(t, err)
				assert.Equal(t, *tc.want, v)
			} else if tc.errText == "" {
				_, err := s.Get(ctx, idA)
				require.ErrorIs(t, err, csidriver.ErrNotFound)
			}
			entries, err := os.ReadDir(dir)
			require.NoError(t, err)
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			assert.Equal(t, tc.left, names)
		})
	}
}

// TestOneNodeAtATime races two nodes attaching one volume: exactly one holds it.
func TestOneNodeAtATime(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	_, err := s.Create(ctx, idA, mib)
	require.NoError(t, err)
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() { errs[i] = s.Attach(ctx, idA, []string{"worker-0", "worker-1"}[i%2]) })
	}
	wg.Wait()
	v, err := s.Get(ctx, idA)
	require.NoError(t, err)
	for i, err := range errs {
		if []string{"worker-0", "worker-1"}[i%2] == v.AttachedTo {
			assert.NoError(t, err)
		} else {
			var elsewhere *csidriver.AttachedElsewhereError
			assert.ErrorAs(t, err, &elsewhere)
		}
	}
}

func TestOpen(t *testing.T) {
	_, err := volumestore.Open("relative/volumes")
	assert.ErrorContains(t, err, "want an absolute path")
	dir := filepath.Join(t.TempDir(), "mini", "volumes")
	s, err := volumestore.Open(dir)
	require.NoError(t, err)
	assert.Equal(t, dir, s.Dir())
	info, err := os.Stat(dir)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), info.Mode().Perm())
}
