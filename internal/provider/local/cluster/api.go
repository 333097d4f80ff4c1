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
//	POST   /v1/nodes/{name}/reboot     a graceful shutdown (cluster.shutdownGracefully), then a boot
//	POST   /v1/nodes/{name}/shutdown   a graceful shutdown; the node stays off (a reboot boots it)
//	POST   /v1/nodes/{name}/stop-api-server  the API server of a leaving control plane stops gracefully; etcd keeps running
//	POST   /v1/nodes/{name}/power-cut  cuts the node's power and restores it (returns once it booted)
//	DELETE /v1/nodes/{name}
//	POST   /v1/images              {"archives": [names in loaded-images/]} → []provider.ImageLoad (imported into every running node)
//	GET    /v1/endpoints           provider.Endpoints
//	POST   /v1/stop                shuts every node down gracefully, at once, and ends the provider (folders kept)
//
// serveAPI listens on the socket, serves the API until ctx ends, and returns once it listens.
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
	srv := &http.Server{Handler: p.apiHandler(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	return nil
}

// apiHandler routes the control API's requests (listed above).
func (p *Provider) apiHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/nodes", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, p.views())
	})
	mux.HandleFunc("POST /v1/nodes", p.handleAddNodes)
	mux.HandleFunc("POST /v1/images", p.handleLoadImages)
	mux.HandleFunc("POST /v1/nodes/{name}/reboot", p.nodeAction("reboot requested", func(n *node) error {
		return p.reboot(n, "reboot requested", graceful)
	}))
	mux.HandleFunc("POST /v1/nodes/{name}/shutdown", p.nodeAction("shutdown requested", p.shutdown))
	mux.HandleFunc("POST /v1/nodes/{name}/stop-api-server", p.nodeAction("API server stop requested (the node is leaving)", p.stopAPIServer))
	mux.HandleFunc("POST /v1/nodes/{name}/power-cut", p.nodeAction("power cut", p.powerCut))
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
		writeJSON(w, provider.Endpoints{APIServer: p.status.APIServer, ClusterAPIServer: p.status.ClusterAPIServer})
	})
	mux.HandleFunc("POST /v1/stop", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusAccepted)
		p.log.Info("stop requested: shutting every node down, keeping their disks")
		p.shutdownAll()
		p.stop()
	})
	return mux
}

// handleAddNodes creates and boots the nodes of the request's list and answers with them.
func (p *Provider) handleAddNodes(w http.ResponseWriter, r *http.Request) {
	// encoding/json, not strictjson: the control API listens on a socket in the cluster's
	// folder, for this program's own CLI.
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
}

// nodeAction handles a request on the node named in the path: event goes into its events,
// then act runs on it.
func (p *Provider) nodeAction(event string, act func(*node) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		p.mu.Lock()
		n, ok := p.nodes[name]
		p.mu.Unlock()
		if !ok {
			http.Error(w, "no node "+name, http.StatusNotFound)
			return
		}
		p.event(n, event)
		if err := act(n); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
