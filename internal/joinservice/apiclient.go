package joinservice

import (
	"fmt"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// APIClient is the join service's Kubernetes client for cfg (in-cluster, or a kubeconfig's):
//   - protobuf, as kubeadm and the controllers use for built-in types: cheaper for the service
//     to encode and for the API server to decode than JSON;
//   - no client-side rate limit: client-go's default (5 requests/s, burst 10) would cap the
//     service at 2.5 joins/s, as a join makes two requests (the removed-node check and the
//     disk-owner record). The handshake limits bound how many joins the service works on, and
//     the API server's priority and fairness bounds what it accepts from any client;
//   - every request ends within 30 s.
func APIClient(cfg *rest.Config) (kubernetes.Interface, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cfg.QPS, cfg.Burst, cfg.RateLimiter = -1, 0, nil
	cfg.Timeout = 30 * time.Second
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return client, nil
}
