package metaserver

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/openconstellation/constellation/internal/metadata"
)

// Client is a node's view of the metadata service; it implements metadata.Provider and
// metadata.Lister.
type Client struct {
	// BaseURL is the service, e.g. http://10.42.0.1:8080.
	BaseURL string
	HTTP    *http.Client
}

// requestTimeout bounds each metadata request.
const requestTimeout = 5 * time.Second

func (c *Client) get(ctx context.Context, path string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.BaseURL+path, nil)
	if err != nil {
		return err
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("metadata %s: %w", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("metadata %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("metadata %s: %s: %s", path, resp.Status, body)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("metadata %s: malformed answer: %w", path, err)
	}
	return nil
}

// Node returns this node's full record.
func (c *Client) Node(ctx context.Context) (Node, error) {
	var n Node
	err := c.get(ctx, "/v1/self", &n)
	return n, err
}

// Instance converts a Node to the platform-independent metadata.
func (n Node) Instance() metadata.Instance {
	return metadata.Instance{Name: n.Name, Role: metadata.Role(n.Role), IPs: n.IPs}
}

// Self implements metadata.Provider.
func (c *Client) Self(ctx context.Context) (metadata.Instance, error) {
	n, err := c.Node(ctx)
	if err != nil {
		return metadata.Instance{}, err
	}
	inst := n.Instance()
	return inst, inst.Validate()
}

// Instances implements metadata.Lister.
func (c *Client) Instances(ctx context.Context) ([]metadata.Instance, error) {
	var nodes []Node
	if err := c.get(ctx, "/v1/instances", &nodes); err != nil {
		return nil, err
	}
	out := make([]metadata.Instance, 0, len(nodes))
	for _, n := range nodes {
		out = append(out, n.Instance())
	}
	return out, nil
}

// JoinEndpoints implements metadata.Provider.
func (c *Client) JoinEndpoints(ctx context.Context) ([]string, error) {
	var eps []string
	err := c.get(ctx, "/v1/join-endpoints", &eps)
	return eps, err
}

// InitSecretHash implements metadata.Provider.
func (c *Client) InitSecretHash(ctx context.Context) ([]byte, error) {
	var v struct {
		Hash string `json:"hash"`
	}
	if err := c.get(ctx, "/v1/init-secret-hash", &v); err != nil {
		return nil, err
	}
	return []byte(v.Hash), nil
}
