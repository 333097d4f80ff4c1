package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/openconstellation/constellation/internal/provider"
)

// The provider's control API: HTTP/JSON on a unix socket in the cluster's folder (mode 0600,
// so only the workspace's owner, root, reaches it), the local equivalent of a cloud's API.
//
//	GET    /v1/nodes               []provider.Node
//	POST   /v1/nodes               []provider.NodeSpec → []provider.Node (created and booted)
//	POST   /v1/nodes/{name}/reboot
//	POST   /v1/nodes/{name}/power-cut  cuts the node's power and restores it (returns once it booted)
//	DELETE /v1/nodes/{name}
//	GET    /v1/endpoints           provider.Endpoints
//	POST   /v1/stop                turns every node off and ends the provider (folders kept)
func (p *Provider) serveAPI(ctx context.Context) error {
	path := filepath.Join(p.spec.Dir, SocketFile)
	_ = os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("control API: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/nodes", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, p.views())
	})
	mux.HandleFunc("POST /v1/nodes", func(w http.ResponseWriter, r *http.Request) {
		var specs []provider.NodeSpec
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&specs); err != nil {
			http.Error(w, "malformed node list: "+err.Error(), http.StatusBadRequest)
			return
		}
		added, err := p.addNodes(specs)
		if err != nil && len(added) == 0 {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		var out []provider.Node
		for _, a := range added {
			p.mu.Lock()
			n := p.nodes[a.Name]
			p.mu.Unlock()
			if n != nil {
				out = append(out, p.view(n))
			}
		}
		writeJSON(w, out)
	})
	mux.HandleFunc("POST /v1/nodes/{name}/reboot", func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		p.mu.Lock()
		n, ok := p.nodes[name]
		p.mu.Unlock()
		if !ok {
			http.Error(w, "no node "+name, http.StatusNotFound)
			return
		}
		p.event(n, "reboot requested")
		if err := p.reboot(n, "reboot requested"); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /v1/nodes/{name}/power-cut", func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		p.mu.Lock()
		n, ok := p.nodes[name]
		p.mu.Unlock()
		if !ok {
			http.Error(w, "no node "+name, http.StatusNotFound)
			return
		}
		p.event(n, "power cut")
		if err := p.powerCut(n); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("DELETE /v1/nodes/{name}", func(w http.ResponseWriter, r *http.Request) {
		err := p.deleteNode(r.PathValue("name"))
		switch {
		case errors.Is(err, provider.ErrNoNode):
			http.Error(w, err.Error(), http.StatusNotFound)
		case err != nil:
			http.Error(w, err.Error(), http.StatusInternalServerError)
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	})
	mux.HandleFunc("GET /v1/endpoints", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, provider.Endpoints{APIServer: p.status.APIServer})
	})
	mux.HandleFunc("POST /v1/stop", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusAccepted)
		p.log.Info("stop requested: turning every node off, keeping their disks")
		p.stop()
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	return nil
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
