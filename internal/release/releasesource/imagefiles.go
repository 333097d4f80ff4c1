package releasesource

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path"
	"time"

	"github.com/openconstellation/constellation/internal/release"
	"github.com/openconstellation/constellation/internal/release/releasedir"
)

// maxImageFileRead bounds a file of a node image read through ImageFiles: a configuration
// file, not an archive.
const maxImageFileRead = 1 << 20

// ImageFiles returns the files of an opened release's node image, to read what the image says
// about itself before it is fetched (provider.NodeImages.ReadImageFacts): the directory of a
// release on disk (checked against the signed digest when it was opened), or, for a release
// of a URL source (List), its files fetched one by one on reading, after the listing was
// checked against the signed digest, each checked against the listing (at most 1 MiB each;
// any other name does not exist). ctx bounds every read.
func (c Client) ImageFiles(ctx context.Context, r *releasedir.Release) (fs.FS, error) {
	if !IsURL(r.Dir) {
		return os.DirFS(r.NodeImage()), nil
	}
	imageURL, files, err := c.imageListing(ctx, r.Dir, r.Verified)
	if err != nil {
		return nil, err
	}
	sums := make(map[string]string, len(files))
	for _, f := range files {
		sums[f.name] = f.sha256
	}
	return &remoteImage{ctx: ctx, c: c, url: imageURL, sums: sums, version: r.Version()}, nil
}

// remoteImage is a node image of a URL source as an fs.FS of its listed files.
type remoteImage struct {
	ctx     context.Context
	c       Client
	url     string
	sums    map[string]string
	version string
}

func (im *remoteImage) Open(name string) (fs.File, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrInvalid}
	}
	want, ok := im.sums[name]
	if !ok {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	data, err := im.c.get(im.ctx, join(im.url, name), maxImageFileRead)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: name, Err: err}
	}
	if got := sha256.Sum256(data); hex.EncodeToString(got[:]) != want {
		return nil, &fs.PathError{Op: "open", Path: name, Err: &release.Error{Reason: release.ReasonTampered, Err: fmt.Errorf(
			"release %s: %s has SHA-256 %x, the signed listing says %s", im.version, join(im.url, name), got, want)}}
	}
	return &memFile{Reader: bytes.NewReader(data), name: path.Base(name)}, nil
}

// memFile is a file read whole.
type memFile struct {
	*bytes.Reader // its Size is the file's
	name          string
}

func (f *memFile) Stat() (fs.FileInfo, error) { return f, nil }
func (f *memFile) Close() error               { return nil }

// fs.FileInfo of the file.
func (f *memFile) Name() string       { return f.name }
func (f *memFile) Mode() fs.FileMode  { return 0o444 }
func (f *memFile) ModTime() time.Time { return time.Time{} }
func (f *memFile) IsDir() bool        { return false }
func (f *memFile) Sys() any           { return nil }
