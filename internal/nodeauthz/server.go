package nodeauthz

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listerscorev1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/openconstellation/constellation/internal/diskowner"
	"github.com/openconstellation/constellation/internal/pki"
)

// Config configures Start.
type Config struct {
	// PKIDir holds the cluster CA (ca.crt, ca.key): a control plane's own. The serving
	// certificate the API server checks is issued from it at start, for 127.0.0.1, and kept
	// in memory only.
	PKIDir string
	// Kubeconfig is the control plane's admin kubeconfig, to watch the removal records with.
	Kubeconfig string
	// Addr to listen on (default Addr; tests use a free port).
	Addr string
	// Node is the control plane's node name. When set, the authorizer's readiness is
	// reported in the Lease ReportName(Node) (report.go); none when empty.
	Node       string
	Log        *slog.Logger
	Registerer prometheus.Registerer
	Now        func() time.Time
}

// Server is a running authorizer.
type Server struct {
	Addr    string
	Removed *InformerSet
	srv     *http.Server
	done    chan error
}

// Start listens, starts watching the removal records and serves the webhook until ctx ends
// or Close. A listen or certificate error is returned at once; a serving error later by Err.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Addr == "" {
		cfg.Addr = Addr
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	ca, err := pki.LoadCA(filepath.Join(cfg.PKIDir, pki.CACert), filepath.Join(cfg.PKIDir, pki.CAKey))
	if err != nil {
		return nil, fmt.Errorf("removed-node authorizer: %w", err)
	}
	now := cfg.Now()
	cert, key, err := ca.NewLeaf(pki.Leaf{
		CommonName: Name, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Server: true,
		NotBefore: now.Add(-5 * time.Minute), NotAfter: ca.Cert.NotAfter,
	})
	if err != nil {
		return nil, fmt.Errorf("removed-node authorizer: serving certificate: %w", err)
	}
	restCfg, err := clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("removed-node authorizer: %w", err)
	}
	restCfg.Timeout = 30 * time.Second
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return nil, fmt.Errorf("removed-node authorizer: %w", err)
	}
	removed := WatchRemoved(ctx, client)
	handler, err := NewHandler(removed, cfg.Log, cfg.Registerer, cfg.Now)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("removed-node authorizer: %w", err)
	}
	s := &Server{
		Addr: ln.Addr().String(), Removed: removed, done: make(chan error, 1),
		srv: &http.Server{
			Handler:           handler,
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       10 * time.Second,
			WriteTimeout:      10 * time.Second,
			TLSConfig: &tls.Config{
				MinVersion:   tls.VersionTLS13,
				Certificates: []tls.Certificate{{Certificate: [][]byte{cert.Raw}, PrivateKey: key, Leaf: cert}},
			},
			ErrorLog: slog.NewLogLogger(cfg.Log.Handler(), slog.LevelDebug),
		},
	}
	go func() {
		err := s.srv.ServeTLS(ln, "", "")
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		s.done <- err
	}()
	go func() {
		<-ctx.Done()
		_ = s.srv.Close()
	}()
	if cfg.Node != "" {
		go report(ctx, client, cfg.Node, s.Addr, ca.Cert, cfg.Log, cfg.Now)
	}
	cfg.Log.Info("removed-node authorizer serving", "addr", s.Addr)
	return s, nil
}

// Err returns a channel that yields the serving error (nil once closed).
func (s *Server) Err() <-chan error { return s.done }

// Close stops serving.
func (s *Server) Close() error { return s.srv.Close() }

// InformerSet is the set of removed nodes as the cluster's removal records say, kept in sync
// by a watch.
type InformerSet struct {
	lister listerscorev1.ConfigMapNamespaceLister
	synced cache.InformerSynced
}

// WatchRemoved watches the removal records (internal/diskowner) until ctx ends.
func WatchRemoved(ctx context.Context, client kubernetes.Interface) *InformerSet {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithNamespace(diskowner.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = labels.Set{diskowner.RecordKindLabel: diskowner.RemovedLabel}.String()
		}))
	cms := factory.Core().V1().ConfigMaps()
	set := &InformerSet{lister: cms.Lister().ConfigMaps(diskowner.Namespace), synced: cms.Informer().HasSynced}
	factory.Start(ctx.Done())
	return set
}

// Synced reports whether the set has listed the records once.
func (s *InformerSet) Synced() bool { return s.synced() }

// Removed reports whether a record says name was removed: the record of its name, naming
// it (a record naming another node, or none, removes nobody).
func (s *InformerSet) Removed(name string) bool {
	cm, err := s.lister.Get(diskowner.RemovedObjectName(name))
	return err == nil && recordNames(cm, name)
}

func recordNames(cm *corev1.ConfigMap, name string) bool {
	return cm.Data[diskowner.NodeKey] == name
}
