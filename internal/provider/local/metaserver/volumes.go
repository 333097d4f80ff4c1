package metaserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/openconstellation/constellation/internal/csidriver"
	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider/local/volumestore"
	"github.com/openconstellation/constellation/pkg/strictjson"
)

// The volume API (docs/local-provider.md "Metadata service"): the local platform's storage
// API for the cluster's CSI driver. As on a cloud, where only the controller's identity may
// create, attach and delete disks, the calls that change volumes are the control planes'
// alone (the driver's controller runs there); any node may ask where a volume attached to
// itself is, and only that.

// Volumes is the provider's volume storage (volumestore.Store).
type Volumes interface {
	csidriver.Backing
	// Path returns the backing file of a volume attached to node; any other volume is an
	// error wrapping csidriver.ErrNotAttached.
	Path(ctx context.Context, id, node string) (string, error)
}

// SetVolumes gives the server the provider's volume storage, which enables the volume API.
func (s *Server) SetVolumes(v Volumes) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.volumes = v
}

// Paths and wire types of the volume API.
const (
	PathVolumes     = "/v1/volumes/"      // + id
	PathSelfVolumes = "/v1/self/volumes/" // + id
)

// Volume is a volume as the volume API describes it.
type Volume struct {
	ID         string `json:"id"`
	Bytes      int64  `json:"bytes"`
	AttachedTo string `json:"attachedTo"`
}

// VolumeSize is the body of a create or expand request, and the answer of an expand.
type VolumeSize struct {
	Bytes int64 `json:"bytes"`
}

// Attachment is the body of an attach request.
type Attachment struct {
	Node string `json:"node"`
}

// VolumePath is the answer of a node's lookup of a volume attached to it.
type VolumePath struct {
	Path string `json:"path"`
}

// VolumeError is the body of every refusal of the volume API: Reason says which, Node names
// the node holding the volume (ReasonAttachedElsewhere, ReasonAttached).
type VolumeError struct {
	Reason  string `json:"reason"`
	Node    string `json:"node,omitempty"`
	Message string `json:"message"`
}

// Reasons of VolumeError.
const (
	ReasonNotFound          = "not-found"          // 404: no volume of that id (csidriver.ErrNotFound)
	ReasonExists            = "exists"             // 409: exists with another size (csidriver.ErrExists)
	ReasonAttached          = "attached"           // 409: delete of an attached volume (csidriver.ErrAttached)
	ReasonAttachedElsewhere = "attached-elsewhere" // 409: another node holds it (*csidriver.AttachedElsewhereError)
	ReasonNotAttached       = "not-attached"       // 403: not attached to the asking node (csidriver.ErrNotAttached)
	ReasonNodeNotFound      = "node-not-found"     // 404: attach to a node the platform does not have
	ReasonForbidden         = "forbidden"          // 403: the caller may not (not a control plane, not a node)
	ReasonBadRequest        = "bad-request"        // 400
	ReasonNoVolumes         = "no-volumes"         // 501: this provider has no volume storage
	ReasonInternal          = "internal"           // 500
)

// maxVolumeRequest bounds a request body of the volume API: one number or one node name.
const maxVolumeRequest = 1 << 10

func (s *Server) volumeHandlers(mux *http.ServeMux) {
	mux.HandleFunc("PUT /v1/volumes/{id}", s.controlPlaneOnly(func(w http.ResponseWriter, r *http.Request, v Volumes, id string) {
		var req VolumeSize
		if !readVolumeRequest(w, r, &req) {
			return
		}
		if err := checkBytes(req.Bytes); err != nil {
			writeVolumeError(w, http.StatusBadRequest, VolumeError{Reason: ReasonBadRequest, Message: err.Error()})
			return
		}
		vol, err := v.Create(r.Context(), id, req.Bytes)
		if err != nil {
			writeBackingError(w, err)
			return
		}
		writeJSON(w, Volume{ID: vol.ID, Bytes: vol.Bytes, AttachedTo: vol.AttachedTo})
	}))
	mux.HandleFunc("GET /v1/volumes/{id}", s.controlPlaneOnly(func(w http.ResponseWriter, r *http.Request, v Volumes, id string) {
		vol, err := v.Get(r.Context(), id)
		if err != nil {
			writeBackingError(w, err)
			return
		}
		writeJSON(w, Volume{ID: vol.ID, Bytes: vol.Bytes, AttachedTo: vol.AttachedTo})
	}))
	mux.HandleFunc("DELETE /v1/volumes/{id}", s.controlPlaneOnly(func(w http.ResponseWriter, r *http.Request, v Volumes, id string) {
		if err := v.Delete(r.Context(), id); err != nil {
			writeBackingError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	mux.HandleFunc("PUT /v1/volumes/{id}/attachment", s.controlPlaneOnly(s.attach))
	mux.HandleFunc("DELETE /v1/volumes/{id}/attachment/{node}", s.controlPlaneOnly(func(w http.ResponseWriter, r *http.Request, v Volumes, id string) {
		node := r.PathValue("node")
		if err := volumestore.CheckNode(node); err != nil {
			writeVolumeError(w, http.StatusBadRequest, VolumeError{Reason: ReasonBadRequest, Message: err.Error()})
			return
		}
		// A node the platform no longer has may still hold a volume until DetachNode ran:
		// detaching from it is always allowed.
		if err := v.Detach(r.Context(), id, node); err != nil {
			writeBackingError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	mux.HandleFunc("POST /v1/volumes/{id}/expand", s.controlPlaneOnly(func(w http.ResponseWriter, r *http.Request, v Volumes, id string) {
		var req VolumeSize
		if !readVolumeRequest(w, r, &req) {
			return
		}
		if err := checkBytes(req.Bytes); err != nil {
			writeVolumeError(w, http.StatusBadRequest, VolumeError{Reason: ReasonBadRequest, Message: err.Error()})
			return
		}
		n, err := v.Expand(r.Context(), id, req.Bytes)
		if err != nil {
			writeBackingError(w, err)
			return
		}
		writeJSON(w, VolumeSize{Bytes: n})
	}))
	mux.HandleFunc("GET /v1/self/volumes/{id}", s.selfVolume)
}

// attach attaches a volume to a node the platform has. The node is checked again after the
// attachment: a node deleted meanwhile is first unlisted (SetNodes) and then released
// (DetachNode), so an attachment that raced the deletion is undone here or released there,
// and never outlives its node.
func (s *Server) attach(w http.ResponseWriter, r *http.Request, v Volumes, id string) {
	var req Attachment
	if !readVolumeRequest(w, r, &req) {
		return
	}
	if err := volumestore.CheckNode(req.Node); err != nil {
		writeVolumeError(w, http.StatusBadRequest, VolumeError{Reason: ReasonBadRequest, Message: err.Error()})
		return
	}
	noNode := VolumeError{Reason: ReasonNodeNotFound, Node: req.Node, Message: "the platform has no node " + req.Node}
	if !s.hasNode(req.Node) {
		writeVolumeError(w, http.StatusNotFound, noNode)
		return
	}
	if err := v.Attach(r.Context(), id, req.Node); err != nil {
		writeBackingError(w, err)
		return
	}
	if !s.hasNode(req.Node) {
		if err := v.Detach(r.Context(), id, req.Node); err != nil {
			writeBackingError(w, fmt.Errorf("undoing the attachment to the deleted node %s: %w", req.Node, err))
			return
		}
		writeVolumeError(w, http.StatusNotFound, noNode)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// selfVolume tells the asking node where a volume attached to it is.
func (s *Server) selfVolume(w http.ResponseWriter, r *http.Request) {
	n, ok := s.lookup(r.RemoteAddr)
	if !ok {
		writeVolumeError(w, http.StatusForbidden, VolumeError{Reason: ReasonForbidden, Message: "unknown node: no instance has the address " + r.RemoteAddr})
		return
	}
	v, id, ok := s.volumeRequest(w, r)
	if !ok {
		return
	}
	p, err := v.Path(r.Context(), id, n.Name)
	if err != nil {
		writeBackingError(w, err)
		return
	}
	writeJSON(w, VolumePath{Path: p})
}

// controlPlaneOnly serves a volume request of a control plane (by its source address) on the
// volume of a valid id in the path; every other caller is refused before anything else is
// looked at.
func (s *Server) controlPlaneOnly(handle func(http.ResponseWriter, *http.Request, Volumes, string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		n, ok := s.lookup(r.RemoteAddr)
		if !ok {
			writeVolumeError(w, http.StatusForbidden, VolumeError{Reason: ReasonForbidden, Message: "unknown node: no instance has the address " + r.RemoteAddr})
			return
		}
		if metadata.Role(n.Role) != metadata.ControlPlane {
			writeVolumeError(w, http.StatusForbidden, VolumeError{Reason: ReasonForbidden,
				Message: fmt.Sprintf("node %s is a %s: only control planes change volumes", n.Name, n.Role)})
			return
		}
		v, id, ok := s.volumeRequest(w, r)
		if !ok {
			return
		}
		handle(w, r, v, id)
	}
}

// volumeRequest returns the volume storage and the request's volume id, or answers why not.
func (s *Server) volumeRequest(w http.ResponseWriter, r *http.Request) (Volumes, string, bool) {
	s.mu.RLock()
	v := s.volumes
	s.mu.RUnlock()
	if v == nil {
		writeVolumeError(w, http.StatusNotImplemented, VolumeError{Reason: ReasonNoVolumes, Message: "this provider keeps no volumes"})
		return nil, "", false
	}
	id := r.PathValue("id")
	if !csidriver.ValidID(id) {
		writeVolumeError(w, http.StatusBadRequest, VolumeError{Reason: ReasonBadRequest, Message: fmt.Sprintf("volume id %q: want vol- and 32 lower-case hex digits", id)})
		return nil, "", false
	}
	return v, id, true
}

// hasNode reports whether the platform has a node of that name.
func (s *Server) hasNode(name string) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, n := range s.nodes {
		if n.Name == name {
			return true
		}
	}
	return false
}

// readVolumeRequest reads a request body into v strictly (no unknown, duplicate or
// case-variant fields; at most maxVolumeRequest bytes), or answers why not.
func readVolumeRequest(w http.ResponseWriter, r *http.Request, v any) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxVolumeRequest))
	if err == nil {
		err = strictjson.Unmarshal(body, v)
	}
	if err != nil {
		writeVolumeError(w, http.StatusBadRequest, VolumeError{Reason: ReasonBadRequest, Message: "malformed request: " + err.Error()})
		return false
	}
	return true
}

func checkBytes(n int64) error {
	if n < 1 || n > volumestore.MaxBytes {
		return fmt.Errorf("volume size %d: want 1..%d bytes", n, volumestore.MaxBytes)
	}
	return nil
}

// writeBackingError answers a failure of the volume storage with the status and reason the
// client maps back to the csidriver error.
func writeBackingError(w http.ResponseWriter, err error) {
	var elsewhere *csidriver.AttachedElsewhereError
	switch {
	case errors.As(err, &elsewhere):
		writeVolumeError(w, http.StatusConflict, VolumeError{Reason: ReasonAttachedElsewhere, Node: elsewhere.Node, Message: err.Error()})
	case errors.Is(err, csidriver.ErrNotFound):
		writeVolumeError(w, http.StatusNotFound, VolumeError{Reason: ReasonNotFound, Message: err.Error()})
	case errors.Is(err, csidriver.ErrExists):
		writeVolumeError(w, http.StatusConflict, VolumeError{Reason: ReasonExists, Message: err.Error()})
	case errors.Is(err, csidriver.ErrAttached):
		writeVolumeError(w, http.StatusConflict, VolumeError{Reason: ReasonAttached, Message: err.Error()})
	case errors.Is(err, csidriver.ErrNotAttached):
		writeVolumeError(w, http.StatusForbidden, VolumeError{Reason: ReasonNotAttached, Message: err.Error()})
	default:
		writeVolumeError(w, http.StatusInternalServerError, VolumeError{Reason: ReasonInternal, Message: err.Error()})
	}
}

func writeVolumeError(w http.ResponseWriter, status int, e VolumeError) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(e)
}
