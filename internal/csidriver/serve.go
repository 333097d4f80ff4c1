package csidriver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	registration "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// ServeController serves the identity and controller services on endpoint (unix:///path or a
// plain path) until ctx ends.
func ServeController(ctx context.Context, endpoint string, controller *Controller) error {
	path, err := SocketPath(endpoint)
	if err != nil {
		return err
	}
	srv := grpc.NewServer()
	csi.RegisterIdentityServer(srv, Identity{})
	csi.RegisterControllerServer(srv, controller)
	return serve(ctx, controller.log, map[string]*grpc.Server{path: srv})
}

// NodeSocket is the node service's socket under the kubelet's plugin directory
// (/var/lib/kubelet/plugins).
func NodeSocket(pluginDir string) string { return filepath.Join(pluginDir, Name, "csi.sock") }

// RegistrationSocket is the kubelet plugin-registration socket under the kubelet's
// registration directory (/var/lib/kubelet/plugins_registry).
func RegistrationSocket(registrationDir string) string {
	return filepath.Join(registrationDir, Name+"-reg.sock")
}

// ServeNode serves the identity and node services on NodeSocket(pluginDir) and registers the
// driver with the kubelet on RegistrationSocket(registrationDir) (what node-driver-registrar
// does in other drivers), until ctx ends. The kubelet watches the registration directory,
// asks GetInfo, and then dials the node socket.
func ServeNode(ctx context.Context, pluginDir, registrationDir string, node *Node) error {
	nodeSock, regSock := NodeSocket(pluginDir), RegistrationSocket(registrationDir)
	csiSrv := grpc.NewServer()
	csi.RegisterIdentityServer(csiSrv, Identity{})
	csi.RegisterNodeServer(csiSrv, node)
	regSrv := grpc.NewServer()
	registration.RegisterRegistrationServer(regSrv, &registrar{endpoint: nodeSock, log: node.log})
	// The node socket first: the kubelet dials it as soon as it sees the registration socket.
	return serve(ctx, node.log, map[string]*grpc.Server{nodeSock: csiSrv, regSock: regSrv}, nodeSock, regSock)
}

// registrar answers the kubelet's plugin watcher.
type registrar struct {
	registration.UnimplementedRegistrationServer
	endpoint string
	log      *slog.Logger
}

func (r *registrar) GetInfo(context.Context, *registration.InfoRequest) (*registration.PluginInfo, error) {
	return &registration.PluginInfo{
		Type:              registration.CSIPlugin,
		Name:              Name,
		Endpoint:          r.endpoint,
		SupportedVersions: []string{"1.0.0"},
	}, nil
}

func (r *registrar) NotifyRegistrationStatus(_ context.Context, st *registration.RegistrationStatus) (*registration.RegistrationStatusResponse, error) {
	if st.GetPluginRegistered() {
		r.log.Info("registered with the kubelet", "driver", Name)
	} else {
		r.log.Error("the kubelet refused the driver's registration", "driver", Name, "error", st.GetError())
	}
	return &registration.RegistrationStatusResponse{}, nil
}

// SocketPath is the file of a unix endpoint: "unix:///csi/csi.sock", "unix:/csi/csi.sock" or
// "/csi/csi.sock".
func SocketPath(endpoint string) (string, error) {
	if strings.HasPrefix(endpoint, "/") {
		return endpoint, nil
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return "", fmt.Errorf("endpoint %q: %w", endpoint, err)
	}
	if u.Scheme != "unix" || u.Host != "" || !strings.HasPrefix(u.Path, "/") {
		return "", fmt.Errorf("endpoint %q: want unix:///absolute/path", endpoint)
	}
	return u.Path, nil
}

// serve listens on each socket (order: the order of paths, or any) and serves until ctx ends
// or a server fails.
func serve(ctx context.Context, log *slog.Logger, servers map[string]*grpc.Server, order ...string) error {
	if len(order) == 0 {
		for path := range servers {
			order = append(order, path)
		}
	}
	errc := make(chan error, len(servers))
	var started []string
	defer func() {
		for _, path := range started {
			servers[path].Stop()
			_ = os.Remove(path)
		}
	}()
	for _, path := range order {
		lis, err := listenUnix(path)
		if err != nil {
			return err
		}
		started = append(started, path)
		srv := servers[path]
		go func() {
			if err := srv.Serve(lis); err != nil {
				errc <- fmt.Errorf("serving %s: %w", path, err)
			}
		}()
		log.Info("serving CSI", "socket", path)
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		return err
	}
}

// listenUnix listens on path, replacing a stale socket a previous run left (a socket no one
// serves any more). Anything that is not a socket is not ours to remove.
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("creating the socket's directory: %w", err)
	}
	if st, err := os.Lstat(path); err == nil {
		if st.Mode().Type() != os.ModeSocket {
			return nil, fmt.Errorf("%s exists and is not a socket", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("removing stale socket: %w", err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", path, err)
	}
	// Only root (the kubelet, the sidecars of the controller's pod) talks to the driver.
	if err := os.Chmod(path, 0o600); err != nil {
		lis.Close()
		return nil, fmt.Errorf("restricting %s: %w", path, err)
	}
	return lis, nil
}
