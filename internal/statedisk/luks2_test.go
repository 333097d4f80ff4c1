package statedisk_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/openconstellation/constellation/internal/statedisk"
)

// This machine's kernel has no device-mapper: cryptsetup formats, rekeys, backs up,
// restores and tags headers on plain files, but cannot format integrity (dm-integrity) or
// open a mapping. The tests run the real cryptsetup for everything but those two, through
// fakeDM:
//   - luksFormat runs without --integrity (the recorded command line keeps it);
//   - open runs as open --test-passphrase with the same header copy and key, so the key
//     check is cryptsetup's; on success a symlink <mapper dir>/<name> to a plain file
//     stands in for the mapping, on which the real mkfs.ext4 runs; close removes it;
//   - mounts are recorded, not made;
//   - the header check runs ParseLUKS2Header on the real copy; only if that refuses it at
//     the policy stage (parse and checksums passed) is the policy run again on the copy
//     with the two things cryptsetup could not make here filled in (the 96-byte key size
//     and the hmac(sha256) segment integrity), so every other check applies to what
//     cryptsetup really wrote.
// TestLUKS2WithoutIntegrityRefused runs the unmodified check.

type invocation struct {
	args       []string // as LUKS2 made them
	stdin, fd3 []byte
}

type fakeDM struct {
	t         *testing.T
	mapperDir string
	backing   string // the plaintext "block device"
	calls     []invocation
	mounts    map[string]string // target → source
	mountErr  error
}

const mappingName = "state"

// newLUKS2 returns storage on a 32 MiB file (zeros: no LUKS header yet) driven through a
// fakeDM whose header check fills in integrity.
func newLUKS2(t *testing.T) (*statedisk.LUKS2, *fakeDM) {
	t.Helper()
	l, dm := newLUKS2Real(t)
	statedisk.SetLUKS2System(l, dm.system(checkAsIfIntegrity(t)))
	return l, dm
}

// newLUKS2Real is newLUKS2 with the production header check.
func newLUKS2Real(t *testing.T) (*statedisk.LUKS2, *fakeDM) {
	t.Helper()
	dir := t.TempDir()
	dm := &fakeDM{t: t, mapperDir: filepath.Join(dir, "mapper"), backing: filepath.Join(dir, "plain.img"), mounts: map[string]string{}}
	require.NoError(t, os.Mkdir(dm.mapperDir, 0o700))
	l := &statedisk.LUKS2{
		Device:     filepath.Join(dir, "disk.img"),
		Name:       mappingName,
		MountPoint: filepath.Join(dir, "mnt"),
		HeaderDir:  filepath.Join(dir, "headers"),
	}
	require.NoError(t, os.Mkdir(l.HeaderDir, 0o700))
	require.NoError(t, os.WriteFile(l.Device, nil, 0o600))
	require.NoError(t, os.Truncate(l.Device, 32<<20))
	statedisk.SetLUKS2System(l, dm.system(statedisk.ParseLUKS2Header))
	t.Cleanup(func() { assert.NoError(t, l.Lock(context.Background())) })
	return l, dm
}

func (dm *fakeDM) system(check func(io.ReaderAt) (*statedisk.LUKS2Header, error)) statedisk.LUKS2System {
	return statedisk.LUKS2System{
		Run:       dm.run,
		MapperDir: dm.mapperDir,
		Mount: func(source, target string) error {
			if dm.mountErr != nil {
				return dm.mountErr
			}
			if _, err := os.Stat(source); err != nil {
				return err
			}
			dm.mounts[target] = source
			return nil
		},
		Unmount:     func(target string) error { delete(dm.mounts, target); return nil },
		Mounted:     func(path string) (bool, error) { return dm.mounts[path] != "", nil },
		CheckHeader: check,
	}
}

func (dm *fakeDM) run(cmd *exec.Cmd) error {
	inv := invocation{args: slices.Clone(cmd.Args)}
	if cmd.Stdin != nil {
		data, err := io.ReadAll(cmd.Stdin)
		require.NoError(dm.t, err)
		inv.stdin, cmd.Stdin = data, bytes.NewReader(data)
	}
	if len(cmd.ExtraFiles) > 0 {
		data, err := io.ReadAll(cmd.ExtraFiles[0])
		require.NoError(dm.t, err)
		inv.fd3 = data
		r, w, err := os.Pipe()
		require.NoError(dm.t, err)
		defer r.Close()
		_, err = w.Write(data)
		require.NoError(dm.t, err)
		require.NoError(dm.t, w.Close())
		cmd.ExtraFiles[0] = r
	}
	dm.calls = append(dm.calls, inv)

	args := cmd.Args
	if len(args) < 2 || filepath.Base(args[0]) != "cryptsetup" {
		return cmd.Run()
	}
	switch args[1] {
	case "luksFormat":
		if i := slices.Index(args, "--integrity"); i >= 0 {
			cmd.Args = slices.Delete(slices.Clone(args), i, i+2)
		}
	case "open":
		if slices.Contains(args, "--test-passphrase") {
			break
		}
		name := args[len(args)-1]
		cmd.Args = append(slices.Clone(args[:len(args)-1]), "--test-passphrase")
		if err := cmd.Run(); err != nil {
			return err
		}
		if _, err := os.Stat(dm.backing); errors.Is(err, os.ErrNotExist) {
			require.NoError(dm.t, os.WriteFile(dm.backing, nil, 0o600))
			require.NoError(dm.t, os.Truncate(dm.backing, 16<<20))
		}
		return os.Symlink(dm.backing, filepath.Join(dm.mapperDir, name))
	case "close":
		return os.Remove(filepath.Join(dm.mapperDir, args[len(args)-1]))
	}
	return cmd.Run()
}

// since returns the invocations after the first n.
func (dm *fakeDM) since(n int) []invocation { return dm.calls[n:] }

// find returns the cryptsetup invocations of action.
func (dm *fakeDM) find(action string) []invocation {
	var found []invocation
	for _, c := range dm.calls {
		if c.args[0] == "cryptsetup" && c.args[1] == action {
			found = append(found, c)
		}
	}
	return found
}

func (dm *fakeDM) mkfsRuns() []invocation {
	var found []invocation
	for _, c := range dm.calls {
		if c.args[0] == "mkfs.ext4" {
			found = append(found, c)
		}
	}
	return found
}

func (dm *fakeDM) mapped() bool {
	_, err := os.Lstat(filepath.Join(dm.mapperDir, mappingName))
	return err == nil
}

// checkAsIfIntegrity is the header check described at the top of this file.
func checkAsIfIntegrity(t *testing.T) func(io.ReaderAt) (*statedisk.LUKS2Header, error) {
	return func(r io.ReaderAt) (*statedisk.LUKS2Header, error) {
		h, err := statedisk.ParseLUKS2Header(r)
		if err == nil || !strings.HasPrefix(err.Error(), "LUKS2 header refused: ") {
			return h, err
		}
		img, err := io.ReadAll(io.NewSectionReader(r, 0, 64<<20))
		require.NoError(t, err)
		return statedisk.ParseLUKS2Header(bytes.NewReader(rewrite(t, img, func(md map[string]any) {
			for _, ks := range md["keyslots"].(map[string]any) {
				if ks := ks.(map[string]any); ks["key_size"] == float64(64) {
					ks["key_size"] = statedisk.LUKS2VolumeKeySize
				}
			}
			for _, seg := range md["segments"].(map[string]any) {
				if seg := seg.(map[string]any); seg["integrity"] == nil {
					seg["integrity"] = map[string]any{"type": statedisk.LUKS2Integrity, "journal_encryption": "none", "journal_integrity": "none"}
				}
			}
		})))
	}
}

// testPassphrase asks cryptsetup itself, past all of LUKS2's code, whether key opens the
// volume on device.
func testPassphrase(t *testing.T, device string, key []byte) error {
	t.Helper()
	cmd := exec.Command("cryptsetup", "open", "--test-passphrase", "--key-file", "-", "--keyfile-size", "32", device)
	cmd.Stdin = bytes.NewReader(key)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return errors.New(string(out))
	}
	return nil
}

func fileSum(t *testing.T, path string) [32]byte {
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	return sha256.Sum256(data)
}

func isExt4(t *testing.T, path string) bool {
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	return len(data) > 1082 && binary.LittleEndian.Uint16(data[1080:]) == 0xef53
}

func TestLUKS2Lifecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l, dm := newLUKS2(t)

	ok, err := l.Exists()
	require.NoError(t, err)
	assert.False(t, ok, "a fresh node has no storage")
	initialized, err := l.Initialized()
	require.NoError(t, err)
	assert.False(t, initialized)
	_, err = l.UUID()
	assert.ErrorIs(t, err, statedisk.ErrNotCreated)
	assert.ErrorIs(t, l.Unlock(ctx, key(t)), statedisk.ErrNotCreated)
	assert.ErrorIs(t, l.Rekey(ctx, key(t), key(t)), statedisk.ErrNotCreated)
	assert.ErrorIs(t, l.MarkInitialized(), statedisk.ErrNotCreated)

	// Fresh node: random key; Create formats and makes the filesystem.
	random := key(t)
	require.NoError(t, l.Create(ctx, random))
	assert.True(t, isExt4(t, dm.backing), "Create made the filesystem on the mapping")
	assert.False(t, dm.mapped(), "Create closed the mapping")
	ok, err = l.Exists()
	require.NoError(t, err)
	assert.True(t, ok)
	id, err := l.UUID()
	require.NoError(t, err)
	assert.True(t, statedisk.ValidUUID(id), id)
	initialized, err = l.Initialized()
	require.NoError(t, err)
	assert.False(t, initialized)
	require.NoError(t, testPassphrase(t, l.Device, random))

	// Init/join: rekey, mark, unlock.
	derived := key(t)
	require.NoError(t, l.Rekey(ctx, random, derived))
	assert.NoError(t, testPassphrase(t, l.Device, derived), "the new key opens the volume on the device")
	assert.Error(t, testPassphrase(t, l.Device, random), "the old key is gone")
	again, err := l.UUID()
	require.NoError(t, err)
	assert.Equal(t, id, again, "rekeying keeps the id")

	require.NoError(t, l.MarkInitialized())
	require.NoError(t, l.MarkInitialized(), "marking twice is not an error")
	initialized, err = l.Initialized()
	require.NoError(t, err)
	assert.True(t, initialized)
	token, err := exec.Command("cryptsetup", "token", "export", "--token-id", "0", l.Device).CombinedOutput()
	require.NoError(t, err, string(token))
	assert.JSONEq(t, `{"type":"constellation-initialized","keyslots":[]}`, string(token))
	assert.Len(t, dm.find("token"), 1, "one marker token")

	mkfsRuns := len(dm.mkfsRuns())
	require.NoError(t, l.Unlock(ctx, derived))
	assert.True(t, dm.mapped())
	assert.Equal(t, filepath.Join(dm.mapperDir, mappingName), dm.mounts[l.MountPoint])
	assert.Len(t, dm.mkfsRuns(), mkfsRuns, "Unlock never makes a filesystem")
	assert.ErrorContains(t, l.Unlock(ctx, derived), "is already mounted")
	require.NoError(t, l.Lock(ctx))
	assert.False(t, dm.mapped())
	assert.Empty(t, dm.mounts)
	closes := len(dm.find("close"))
	require.NoError(t, l.Lock(ctx), "locking twice is not an error")
	assert.Len(t, dm.find("close"), closes, "nothing to close")

	t.Run("wrong keys rejected", func(t *testing.T) {
		for name, k := range map[string][]byte{"random key of the fresh node": random, "another key": key(t)} {
			assert.ErrorIs(t, l.Unlock(ctx, k), statedisk.ErrWrongKey, name)
			assert.False(t, dm.mapped(), name)
			assert.ErrorIs(t, l.Rekey(ctx, k, key(t)), statedisk.ErrWrongKey, name)
		}
		assert.NoError(t, testPassphrase(t, l.Device, derived), "failed rekeys left the key")
		assert.ErrorContains(t, l.Unlock(ctx, []byte("short")), "state key of 5 bytes")
		assert.ErrorContains(t, l.Rekey(ctx, derived, []byte("short")), "state key of 5 bytes")
	})

	t.Run("key checked without opening", func(t *testing.T) {
		before, calls := fileSum(t, l.Device), len(dm.calls)
		assert.NoError(t, l.CheckKey(ctx, derived))
		for name, k := range map[string][]byte{"random key of the fresh node": random, "another key": key(t)} {
			assert.ErrorIs(t, l.CheckKey(ctx, k), statedisk.ErrWrongKey, name)
		}
		assert.ErrorContains(t, l.CheckKey(ctx, []byte("short")), "state key of 5 bytes")
		assert.Equal(t, before, fileSum(t, l.Device), "nothing written")
		assert.False(t, dm.mapped(), "nothing mapped")
		assert.Empty(t, dm.mounts, "nothing mounted")
		for _, c := range dm.since(calls) {
			assert.Contains(t, []string{"luksHeaderBackup", "open"}, c.args[1], c.args)
			if c.args[1] == "open" {
				assert.Contains(t, c.args, "--test-passphrase")
			}
		}
	})

	t.Run("reboot", func(t *testing.T) {
		initialized, err := l.Initialized()
		require.NoError(t, err)
		assert.True(t, initialized)
		again, err := l.UUID()
		require.NoError(t, err)
		assert.Equal(t, id, again, "the id is stable: the rejoin ticket's key is the same")
		require.NoError(t, l.Unlock(ctx, derived))
		require.NoError(t, l.Lock(ctx))
	})

	t.Run("initialized storage is never replaced", func(t *testing.T) {
		before := fileSum(t, l.Device)
		assert.ErrorContains(t, l.Create(ctx, key(t)), "initialized: refusing to replace it")
		assert.Equal(t, before, fileSum(t, l.Device))
		assert.Len(t, dm.find("luksFormat"), 1)
	})

	t.Run("keys only on stdin and fd 3", func(t *testing.T) {
		keys := [][]byte{random, derived}
		for _, c := range dm.calls {
			for _, a := range c.args {
				for _, k := range keys {
					assert.NotContains(t, a, string(k), c.args)
					assert.NotContains(t, a, hex.EncodeToString(k), c.args)
				}
			}
			switch {
			case c.args[0] == "mkfs.ext4":
				assert.Nil(t, c.stdin, c.args)
			case c.args[1] == "luksFormat", c.args[1] == "open":
				assert.Len(t, c.stdin, statedisk.KeySize, c.args)
				assert.Nil(t, c.fd3, c.args)
			case c.args[1] == "luksChangeKey":
				assert.Len(t, c.stdin, statedisk.KeySize, c.args)
				assert.Len(t, c.fd3, statedisk.KeySize, c.args)
			case c.args[1] == "token":
				assert.JSONEq(t, `{"type":"constellation-initialized","keyslots":[]}`, string(c.stdin))
			default:
				assert.Nil(t, c.stdin, c.args)
				assert.Nil(t, c.fd3, c.args)
			}
		}
	})

	t.Run("header copies removed", func(t *testing.T) {
		entries, err := os.ReadDir(l.HeaderDir)
		require.NoError(t, err)
		assert.Empty(t, entries)
	})
}

// The exact command lines: the configuration the header policy demands, keys from stdin
// and fd 3, and every key-taking command pointed at a checked copy, never at the device's
// header.
func TestLUKS2CommandLines(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l, dm := newLUKS2(t)
	k1, k2 := key(t), key(t)
	require.NoError(t, l.Create(ctx, k1))
	require.NoError(t, l.Rekey(ctx, k1, k2))
	require.NoError(t, l.CheckKey(ctx, k2))
	require.NoError(t, l.Unlock(ctx, k2))
	require.NoError(t, l.Lock(ctx))

	// No --keyslot-cipher anywhere: cryptsetup 2.6.1 refuses it with --integrity (the
	// header check pins its default instead).
	keyslot := []string{"--hash", "sha256", "--pbkdf", "argon2id", "--pbkdf-force-iterations", "4",
		"--pbkdf-memory", "32768", "--pbkdf-parallel", "1"}
	stdinKey := []string{"--key-file", "-", "--keyfile-size", "32"}
	copyArg := func(c invocation, after string) string {
		i := slices.Index(c.args, after)
		require.GreaterOrEqual(t, i, 0, c.args)
		return c.args[i+1]
	}

	format := dm.find("luksFormat")
	require.Len(t, format, 1)
	assert.Equal(t, slices.Concat([]string{"cryptsetup", "luksFormat", "--type", "luks2", "--batch-mode",
		"--cipher", "aes-xts-plain64", "--key-size", "512", "--integrity", "hmac-sha256", "--sector-size", "4096"},
		keyslot, stdinKey, []string{l.Device}), format[0].args)
	assert.Equal(t, k1, format[0].stdin)

	change := dm.find("luksChangeKey")
	require.Len(t, change, 1)
	header := change[0].args[len(change[0].args)-2]
	assert.Equal(t, slices.Concat([]string{"cryptsetup", "luksChangeKey", "--type", "luks2"}, keyslot, stdinKey,
		[]string{"--new-keyfile-size", "32", header, "/dev/fd/3"}), change[0].args)
	assert.Equal(t, k1, change[0].stdin)
	assert.Equal(t, k2, change[0].fd3)
	assert.True(t, strings.HasPrefix(header, l.HeaderDir+string(filepath.Separator)), header)
	restore := dm.find("luksHeaderRestore")
	require.Len(t, restore, 1)
	assert.Equal(t, []string{"cryptsetup", "luksHeaderRestore", "--type", "luks2", "--batch-mode",
		"--header-backup-file", header, l.Device}, restore[0].args, "the rekeyed copy is what goes back")

	opens := dm.find("open")
	require.Len(t, opens, 3, "one for mkfs in Create, one for CheckKey, one for Unlock")
	for i, o := range opens {
		header := copyArg(o, "--header")
		open := []string{"cryptsetup", "open", "--type", "luks2", "--header", header, "--disable-external-tokens"}
		want := slices.Concat(open, stdinKey, []string{l.Device, mappingName})
		if i == 1 {
			want = slices.Concat(open, []string{"--test-passphrase"}, stdinKey, []string{l.Device})
		}
		assert.Equal(t, want, o.args)
		assert.True(t, strings.HasPrefix(header, l.HeaderDir+string(filepath.Separator)), header)
	}
	assert.Equal(t, k1, opens[0].stdin)
	assert.Equal(t, k2, opens[1].stdin)
	assert.Equal(t, k2, opens[2].stdin)

	mkfs := dm.mkfsRuns()
	require.Len(t, mkfs, 1)
	assert.Equal(t, []string{"mkfs.ext4", "-q", "-E", "nodiscard", filepath.Join(dm.mapperDir, mappingName)}, mkfs[0].args)

	// Every copy a key met was checked first: the backup that made it comes right before.
	for i, c := range dm.calls {
		if c.stdin == nil || c.args[1] == "luksFormat" || c.args[1] == "token" {
			continue
		}
		var header string
		switch c.args[1] {
		case "open":
			header = copyArg(c, "--header")
		case "luksChangeKey":
			header = c.args[len(c.args)-2]
		default:
			t.Fatalf("key given to %q", c.args)
		}
		require.Greater(t, i, 0)
		prev := dm.calls[i-1]
		assert.Equal(t, []string{"cryptsetup", "luksHeaderBackup", "--type", "luks2", "--header-backup-file", header, l.Device}, prev.args)
	}
}

// A header changed on the device is refused by every operation before any key reaches
// cryptsetup, and the refused operations change nothing.
func TestLUKS2TamperedHeader(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		mutate func(md map[string]any)
		raw    func(img []byte) []byte
		want   string
	}{
		"null cipher": {
			mutate: func(md map[string]any) { obj(md, "segments", "0")["encryption"] = "cipher_null-ecb" },
			want:   `segment 0 cipher "cipher_null-ecb", want aes-xts-plain64`,
		},
		"null cipher in the keyslot area": {
			mutate: func(md map[string]any) {
				for _, ks := range md["keyslots"].(map[string]any) {
					ks.(map[string]any)["area"].(map[string]any)["encryption"] = "cipher_null-ecb"
				}
			},
			want: "area raw/cipher_null-ecb/64",
		},
		"weak KDF": {
			mutate: func(md map[string]any) {
				for _, ks := range md["keyslots"].(map[string]any) {
					ks.(map[string]any)["kdf"].(map[string]any)["memory"] = 8
				}
			},
			want: "argon2id cost time=4 memory=8 KiB",
		},
		"foreign token": {
			mutate: func(md map[string]any) {
				md["tokens"] = map[string]any{"0": map[string]any{"type": "luks2-keyring", "keyslots": []any{"0"}}}
			},
			want: `token 0 of type "luks2-keyring"`,
		},
		"unknown field": {
			mutate: func(md map[string]any) { obj(md, "segments", "0")["allow_plaintext"] = true },
			want:   `unknown field "allow_plaintext"`,
		},
		// cryptsetup repairs one damaged copy from the other when it reads the header
		// (TestLUKS2DamagedPrimaryRepaired); with both damaged it cannot read it at all.
		"both copies changed, checksums not fixed": {
			raw: func(img []byte) []byte {
				return bytes.ReplaceAll(img, []byte(`"aes-xts-plain64"`), []byte(`"cipher_null-ecb"`))
			},
			want: "is not a valid LUKS device",
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			l, dm := newLUKS2(t)
			k := key(t)
			require.NoError(t, l.Create(ctx, k))

			f, err := os.OpenFile(l.Device, os.O_RDWR, 0)
			require.NoError(t, err)
			t.Cleanup(func() { f.Close() })
			img := make([]byte, 64<<10)
			_, err = f.ReadAt(img, 0)
			require.NoError(t, err)
			if tc.mutate != nil {
				img = rewrite(t, img, tc.mutate)
			}
			if tc.raw != nil {
				img = tc.raw(img)
			}
			_, err = f.WriteAt(img, 0)
			require.NoError(t, err)
			before, calls := fileSum(t, l.Device), len(dm.calls)

			_, err = l.UUID()
			assert.ErrorContains(t, err, tc.want, "UUID")
			assert.ErrorIs(t, err, statedisk.ErrHeaderRefused)
			assert.ErrorIs(t, l.CheckKey(ctx, k), statedisk.ErrHeaderRefused)
			_, err = l.Initialized()
			assert.ErrorContains(t, err, tc.want, "Initialized")
			assert.ErrorContains(t, l.MarkInitialized(), tc.want, "MarkInitialized")
			assert.ErrorContains(t, l.Unlock(ctx, k), tc.want, "Unlock")
			assert.ErrorContains(t, l.CheckKey(ctx, k), tc.want, "CheckKey")
			assert.ErrorContains(t, l.Rekey(ctx, k, key(t)), tc.want, "Rekey")
			assert.ErrorContains(t, l.Create(ctx, key(t)), tc.want, "Create refuses to replace what it cannot read")

			assert.Equal(t, before, fileSum(t, l.Device), "nothing written")
			assert.False(t, dm.mapped())
			for _, c := range dm.since(calls) {
				assert.Equal(t, "luksHeaderBackup", c.args[1], "only the header was read: %q", c.args)
				assert.Nil(t, c.stdin, c.args)
				assert.Nil(t, c.fd3, c.args)
			}
		})
	}
}

// What this machine's cryptsetup makes without dm-integrity is refused by the real check:
// Create formats, then stops at the check before the key reaches open.
func TestLUKS2WithoutIntegrityRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l, dm := newLUKS2Real(t)
	k := key(t)
	err := l.Create(ctx, k)
	assert.ErrorContains(t, err, "segment 0 has no integrity protection")
	assert.ErrorContains(t, err, "keyslot 0 key size 64 bytes, want 96")
	assert.Empty(t, dm.find("open"))
	assert.Empty(t, dm.mkfsRuns(), "no filesystem")

	calls := len(dm.calls)
	_, err = l.UUID()
	assert.ErrorContains(t, err, "segment 0 has no integrity protection")
	assert.ErrorContains(t, l.Unlock(ctx, k), "segment 0 has no integrity protection")
	assert.ErrorContains(t, l.Rekey(ctx, k, key(t)), "segment 0 has no integrity protection")
	for _, c := range dm.since(calls) {
		assert.Nil(t, c.stdin, c.args)
	}
}

// A first boot that ended between Create and MarkInitialized left storage nobody can open:
// the next boot replaces it with a new id and key.
func TestLUKS2InterruptedFirstBoot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l, _ := newLUKS2(t)
	first := key(t)
	require.NoError(t, l.Create(ctx, first))
	firstID, err := l.UUID()
	require.NoError(t, err)

	second := key(t)
	require.NoError(t, l.Create(ctx, second))
	secondID, err := l.UUID()
	require.NoError(t, err)
	assert.NotEqual(t, firstID, secondID)
	assert.Error(t, testPassphrase(t, l.Device, first))
	require.NoError(t, l.Unlock(ctx, second))
}

// cryptsetup repairs a damaged primary header from the secondary when it first reads the
// header (here: the backup for the check), so the check sees, and the keys meet, the
// repaired header.
func TestLUKS2DamagedPrimaryRepaired(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l, _ := newLUKS2(t)
	k := key(t)
	require.NoError(t, l.Create(ctx, k))
	id, err := l.UUID()
	require.NoError(t, err)

	f, err := os.OpenFile(l.Device, os.O_RDWR, 0)
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	_, err = f.WriteAt([]byte(`"cipher_null-ecb"`), 4096+2)
	require.NoError(t, err)
	damaged := fileSum(t, l.Device)

	again, err := l.UUID()
	require.NoError(t, err)
	assert.Equal(t, id, again)
	assert.NotEqual(t, damaged, fileSum(t, l.Device), "cryptsetup wrote the repair")
	require.NoError(t, l.Unlock(ctx, k))
}

// A mount that fails leaves nothing open.
func TestLUKS2MountFailureCloses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l, dm := newLUKS2(t)
	k := key(t)
	require.NoError(t, l.Create(ctx, k))
	dm.mountErr = errors.New("no ext4 here")
	assert.ErrorContains(t, l.Unlock(ctx, k), "no ext4 here")
	assert.False(t, dm.mapped())
	dm.mountErr = nil
	require.NoError(t, l.Unlock(ctx, k))
}

// A mount that reads a sector whose tag does not match (EIO from dm-crypt) says what that
// means on an authenticated volume, and leaves nothing open.
func TestLUKS2SectorRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l, dm := newLUKS2(t)
	k := key(t)
	require.NoError(t, l.Create(ctx, k))
	dm.mountErr = unix.EIO
	err := l.Unlock(ctx, k)
	require.ErrorIs(t, err, statedisk.ErrSectorRefused)
	assert.ErrorIs(t, err, unix.EIO, "the kernel's error is kept")
	assert.False(t, dm.mapped())
}

func TestLUKS2Exists(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		device  func(t *testing.T) string
		want    bool
		wantErr string
	}{
		"zeros": {device: func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "zero.img")
			require.NoError(t, os.WriteFile(p, make([]byte, 1<<20), 0o600))
			return p
		}},
		"LUKS2 header": {want: true, device: func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "hdr.img")
			img, err := cryptsetupHeader()
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(p, img, 0o600))
			return p
		}},
		"damaged header": {want: true, device: func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "hdr.img")
			img, err := cryptsetupHeader()
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(p, bytes.ReplaceAll(img, []byte("aes-xts-plain64"), []byte("aes-xts-plain65")), 0o600))
			return p
		}},
		"secondary header only": {want: true, device: func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "hdr.img")
			img, err := cryptsetupHeader()
			require.NoError(t, err)
			img = bytes.Clone(img) // the cached header is shared
			clear(img[:4096])
			require.NoError(t, os.WriteFile(p, img, 0o600))
			return p
		}},
		"short device": {device: func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "short.img")
			require.NoError(t, os.WriteFile(p, []byte("LUKS"), 0o600))
			return p
		}},
		"missing device": {wantErr: "no such file", device: func(t *testing.T) string {
			return filepath.Join(t.TempDir(), "nothing")
		}},
	} {
		t.Run(name, func(t *testing.T) {
			l := &statedisk.LUKS2{Device: tc.device(t), Name: mappingName}
			ok, err := l.Exists()
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, ok)
		})
	}
}
