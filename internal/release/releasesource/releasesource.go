// Package releasesource reads releases from where they are published: a directory of release
// directories (internal/release/releasedir), or an HTTP(S) URL that serves the same layout
// (docs/releases.md "Release sources"):
//
//	<source>/index.json                     {"releases": ["v0.1.0", "v0.2.0"]}
//	<source>/<version>/release.json         the signed release
//	<source>/<version>/node-image/SHA256SUMS  the node image's listing (local.ImageListing)
//	<source>/<version>/node-image/<file>    each file the listing names
//
// Nothing read from a URL is trusted because of where it came from. A download checks, in this
// order, before it writes a file the CLI uses: the release (release.Open: signature by the
// pinned key, policy), then the listing against the node image digest the release signed, then
// every file against the listing as it streams in; names that leave the node image are refused
// before anything is fetched. The downloaded directory is then opened like any release
// directory (releasedir.Open), which checks it all again.
package releasesource

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/openconstellation/constellation/internal/fileutil"
	"github.com/openconstellation/constellation/internal/release"
	"github.com/openconstellation/constellation/internal/release/releasedir"
	"github.com/openconstellation/constellation/pkg/strictjson"
)

// Names of a release source.
const (
	// IndexFile lists a source's releases.
	IndexFile = "index.json"
	// ListingFile is the node image's sha256sum(1) listing, whose SHA-256 is the node image
	// digest a release signs.
	ListingFile = "SHA256SUMS"
)

// Limits of what a download reads.
const (
	maxIndexSize   = 1 << 20
	maxListingSize = 64 << 10
	// MaxFileSize bounds one file of a node image (the largest, a services image archive, is
	// about 100 MB).
	MaxFileSize = 2 << 30
)

// Index is a source's IndexFile.
type Index struct {
	Releases []string `json:"releases"`
}

// IsURL reports whether source names an HTTP(S) source rather than a directory.
func IsURL(source string) bool {
	return strings.HasPrefix(source, "https://") || strings.HasPrefix(source, "http://")
}

// Client fetches from URL sources.
type Client struct {
	// HTTP is the client (http.DefaultClient when nil); every request also carries the
	// caller's context.
	HTTP *http.Client
}

func (c Client) httpClient() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return &http.Client{Timeout: 10 * time.Minute}
}

// Versions returns the versions a URL source's index lists.
func (c Client) Versions(ctx context.Context, source string) ([]string, error) {
	data, err := c.get(ctx, join(source, IndexFile), maxIndexSize)
	if err != nil {
		return nil, fmt.Errorf("release source %s: %w", source, err)
	}
	versions, err := parseIndex(data)
	if err != nil {
		return nil, fmt.Errorf("release source %s: %s: %w", source, IndexFile, err)
	}
	return versions, nil
}

// parseIndex decodes an index strictly: known keys only, nothing after the object, every
// entry a release version (release.IsVersion: one path element, never "..") and listed once.
// An entry is only a name to look at: each release is checked to be that version when
// opened.
func parseIndex(data []byte) ([]string, error) {
	var idx Index
	if err := strictjson.Unmarshal(data, &idx); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, v := range idx.Releases {
		if !release.IsVersion(v) {
			return nil, fmt.Errorf("lists %q, not a release version", v)
		}
		if seen[v] {
			return nil, fmt.Errorf("lists %s twice", v)
		}
		seen[v] = true
	}
	return idx.Releases, nil
}

// Open fetches the signed release at releaseURL (<source>/<version>) and checks it
// (release.Open), without its node image: what `upgrade check` lists. The URL's last element
// must be a release version, and the release must be that version (policy.Name is set to it).
func (c Client) Open(ctx context.Context, releaseURL string, key *release.PublicKey, policy release.Policy) (*release.Verified, []byte, error) {
	name := Name(releaseURL)
	if !release.IsVersion(name) {
		return nil, nil, fmt.Errorf("release %s: %q is not a release version: a release URL is <source>/<version>, e.g. <source>/v0.2.0", releaseURL, name)
	}
	data, err := c.get(ctx, join(releaseURL, releasedir.EnvelopeFile), release.MaxSize+1)
	if err != nil {
		return nil, nil, fmt.Errorf("release %s: %w", releaseURL, err)
	}
	policy.Name = name
	verified, err := release.Open(ctx, data, key, policy)
	if err != nil {
		return nil, nil, fmt.Errorf("release %s: %w", releaseURL, err)
	}
	return verified, data, nil
}

// Fetch downloads the release at releaseURL into into/<its signed version> (an earlier
// download there is replaced) once the release and every file of its node image passed the
// checks of the package documentation, and returns that directory; nothing is left
// otherwise. The URL must name the version the release signed (Open), so the directory is
// named by both. Open the directory with releasedir.Open to use it.
func (c Client) Fetch(ctx context.Context, releaseURL, into string, key *release.PublicKey, policy release.Policy) (string, error) {
	verified, envelope, err := c.Open(ctx, releaseURL, key, policy)
	if err != nil {
		return "", err
	}
	version := verified.Manifest().Version
	imageURL, files, err := c.imageListing(ctx, releaseURL, verified)
	if err != nil {
		return "", err
	}
	dest := filepath.Join(into, version)
	tmp := dest + ".download"
	if err := os.RemoveAll(tmp); err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	for _, f := range files {
		if err := c.download(ctx, join(imageURL, f.name), filepath.Join(tmp, releasedir.NodeImageDir, filepath.FromSlash(f.name)), f.sha256); err != nil {
			return "", fmt.Errorf("release %s: %w", version, err)
		}
	}
	if err := fileutil.WriteAtomic(filepath.Join(tmp, releasedir.EnvelopeFile), envelope, 0o644); err != nil {
		return "", err
	}
	if err := os.RemoveAll(dest); err != nil {
		return "", err
	}
	return dest, os.Rename(tmp, dest)
}

// imageListing fetches the node image listing of the verified release at releaseURL and
// checks it against the digest the release signed, before any file of the image is fetched.
// It returns the image's URL and the files the listing names.
func (c Client) imageListing(ctx context.Context, releaseURL string, verified *release.Verified) (string, []listed, error) {
	version := verified.Manifest().Version
	imageURL := join(releaseURL, releasedir.NodeImageDir)
	listing, err := c.get(ctx, join(imageURL, ListingFile), maxListingSize)
	if err != nil {
		return "", nil, fmt.Errorf("release %s: %w", version, err)
	}
	if got, want := "sha256:"+hexSum(listing), verified.Manifest().NodeImage.Digest; got != want {
		return "", nil, &release.Error{Reason: release.ReasonTampered, Err: fmt.Errorf(
			"release %s: the node image listing %s has digest %s, the release signed %s", version, join(imageURL, ListingFile), got, want)}
	}
	files, err := parseListing(listing)
	if err != nil {
		return "", nil, &release.Error{Reason: release.ReasonTampered, Err: fmt.Errorf("release %s: %s: %w", version, ListingFile, err)}
	}
	return imageURL, files, nil
}

// List opens every release of source, a directory (releasedir.List) or a URL (its index's
// releases, each signed release fetched and checked, its node image not yet: Fetch checks
// that), newest first, refused ones last.
func (c Client) List(ctx context.Context, source string, key *release.PublicKey, policy release.Policy, digest releasedir.ImageDigest) ([]releasedir.Listed, error) {
	if !IsURL(source) {
		return releasedir.List(ctx, source, key, policy, digest)
	}
	versions, err := c.Versions(ctx, source)
	if err != nil {
		return nil, err
	}
	out := make([]releasedir.Listed, 0, len(versions))
	for _, v := range versions {
		u := join(source, v)
		l := releasedir.Listed{Dir: u}
		verified, _, err := c.Open(ctx, u, key, policy)
		if err != nil {
			l.Err = err
		} else {
			l.Release = &releasedir.Release{Dir: u, Verified: verified}
		}
		out = append(out, l)
	}
	releasedir.Sort(out)
	return out, nil
}

// listed is one line of a listing.
type listed struct{ name, sha256 string }

// namePattern is what a listing may name: a file of the node image, or an archive in its
// images folder; nothing that leaves the node image.
var namePattern = regexp.MustCompile(`\A(images/)?[A-Za-z0-9][A-Za-z0-9._+-]*\z`)

func parseListing(data []byte) ([]listed, error) {
	var out []listed
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok || len(sum) != 64 || strings.Trim(sum, "0123456789abcdef") != "" {
			return nil, fmt.Errorf("line %q: want <64 hex digits>  <name>", sc.Text())
		}
		if !namePattern.MatchString(name) || name == ListingFile || seen[name] {
			return nil, fmt.Errorf("name %q: not a file of a node image, or named twice", name)
		}
		seen[name] = true
		out = append(out, listed{name: name, sha256: sum})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, errors.New("names no file")
	}
	return out, nil
}

// download streams u into path, failing (and leaving nothing) unless its SHA-256 is want.
func (c Client) download(ctx context.Context, u, path, want string) error {
	resp, err := c.request(ctx, u)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(resp.Body, MaxFileSize+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	switch {
	case err != nil:
		err = fmt.Errorf("fetching %s: %w", u, err)
	case n > MaxFileSize:
		err = fmt.Errorf("%s is larger than %d bytes", u, MaxFileSize)
	case hex.EncodeToString(h.Sum(nil)) != want:
		err = &release.Error{Reason: release.ReasonTampered, Err: fmt.Errorf("%s has SHA-256 %x, the signed listing says %s", u, h.Sum(nil), want)}
	}
	if err != nil {
		os.Remove(path)
	}
	return err
}

// get fetches u whole, refusing more than limit bytes.
func (c Client) get(ctx context.Context, u string, limit int64) ([]byte, error) {
	resp, err := c.request(ctx, u)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("fetching %s: %w", u, err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", u, limit)
	}
	return data, nil
}

func (c Client) request(ctx context.Context, u string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetching %s: %w", u, err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("fetching %s: %s", u, resp.Status)
	}
	return resp, nil
}

// join appends a path to a URL.
func join(base, elem string) string {
	u, err := url.Parse(base)
	if err != nil {
		return strings.TrimSuffix(base, "/") + "/" + elem
	}
	u.Path = path.Join(u.Path, elem)
	return u.String()
}

// Name returns the last element of a release URL's path, cleaned as the requests for its
// files are ("<source>/v0.2.0/" and "<source>/x/../v0.2.0" give v0.2.0; "<source>/v0.2.0/.."
// gives the source's own name): the name the URL presents the release under, which Open
// requires to be a release version and the release's signed one.
func Name(releaseURL string) string {
	u, err := url.Parse(releaseURL)
	if err != nil {
		return ""
	}
	return path.Base(path.Clean("/" + u.Path))
}

func hexSum(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}
