package measurements

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/openconstellation/constellation/pkg/attestation/variant"
	"github.com/openconstellation/constellation/pkg/strictjson"
)

// DecodeReferenceSets decodes reference sets (JSON, strictly: strictjson.Unmarshal refuses
// unknown fields, a field twice or in other letter case, and trailing data) and validates them for v. YAML is the configuration file's business: it is
// converted to JSON there, so this package needs no YAML codec.
func DecodeReferenceSets(data []byte, v variant.Variant) (ReferenceSets, error) {
	var sets ReferenceSets
	if err := strictjson.Unmarshal(data, &sets); err != nil {
		return nil, fmt.Errorf("decoding reference sets: %w", err)
	}
	if err := sets.Validate(v); err != nil {
		return nil, err
	}
	return sets, nil
}

// ReadFile reads and decodes the reference sets in path.
func ReadFile(path string, v variant.Variant) (ReferenceSets, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	sets, err := DecodeReferenceSets(data, v)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return sets, nil
}

// Watcher keeps an Active in sync with a reference-set file, typically a ConfigMap key mounted
// into the pod: kubelet updates such a file by swapping a symlink in its directory, which
// replaces the file without writing to it. So the watcher watches the directory, re-reads
// the file on any event there, and also re-reads it every PollInterval in case an event is
// missed. A file that fails to decode or validate is logged and ignored: the sets in force
// stay in force (a typo in a ConfigMap must not lock every node out, or let every node in).
type Watcher struct {
	Path   string
	Active *Active
	Log    *slog.Logger
	// PollInterval defaults to 30 s.
	PollInterval time.Duration
	// OnReload, when set, is called after each reload attempt that found changed content,
	// with its result (metrics).
	OnReload func(sets ReferenceSets, err error)

	last []byte
}

// Run reloads the file at once and then on every change until ctx ends. Active must already
// hold the sets to keep when the file is invalid (NewActive with ReadFile's result). Run returns
// an error only when the directory cannot be watched. Do not call Reload while Run runs.
func (w *Watcher) Run(ctx context.Context) error {
	if w.PollInterval <= 0 {
		w.PollInterval = 30 * time.Second
	}
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching reference sets: %w", err)
	}
	defer fw.Close()
	if err := fw.Add(filepath.Dir(w.Path)); err != nil {
		return fmt.Errorf("watching reference sets in %s: %w", filepath.Dir(w.Path), err)
	}
	w.Reload()
	ticker := time.NewTicker(w.PollInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-fw.Events:
			w.Reload()
		case err := <-fw.Errors:
			w.Log.Warn("reference-set watch error; polling continues", "path", w.Path, "error", err)
		case <-ticker.C:
			w.Reload()
		}
	}
}

// Reload reads the file and, if its content changed since the last reload, stores the sets it
// holds in Active. It reports whether the sets in force changed.
func (w *Watcher) Reload() bool {
	if w.Log == nil {
		w.Log = slog.Default()
	}
	data, err := os.ReadFile(w.Path)
	if err != nil {
		w.Log.Warn("reading reference sets; keeping the sets in force", "path", w.Path, "error", err)
		return false
	}
	if bytes.Equal(data, w.last) {
		return false
	}
	w.last = data
	sets, err := DecodeReferenceSets(data, w.Active.Variant())
	if err == nil {
		err = w.Active.Store(sets)
	}
	if w.OnReload != nil {
		w.OnReload(sets, err)
	}
	if err != nil {
		w.Log.Error("invalid reference sets; keeping the sets in force", "path", w.Path, "error", err)
		return false
	}
	names := make([]string, len(sets))
	for i, s := range sets {
		names[i] = s.Name
	}
	w.Log.Info("reference sets reloaded", "path", w.Path, "sets", names)
	return true
}
