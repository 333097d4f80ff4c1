// Package metadataclient reads the local provider's metadata service (docs/local-provider.md):
// plain HTTP and JSON, the node identified by its source address. It implements
// metadata.Provider for the bootstrapper and metadata.Lister for the join service.
//
// Answers are size-limited, decoded strictly where the contract is fixed, and validated
// (names, roles, addresses, host:port endpoints, bcrypt hash), so a confused metadata service
// yields an error naming the problem, not a half-filled instance.
package metadataclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/openconstellation/constellation/internal/metadata"
	"github.com/openconstellation/constellation/internal/provider/local/metaserver"
	"github.com/openconstellation/constellation/pkg/strictjson"
)

// DefaultURL is where the local provider serves metadata to its nodes.
const DefaultURL = "http://10.42.0.1:8080"

// DefaultTimeout bounds one request whose context has no deadline.
const DefaultTimeout = 10 * time.Second

// maxBody bounds an answer: the instance list of a large local cluster is a few KiB.
const maxBody = 1 << 20

// Paths of the metadata API.
const (
	PathSelf           = "/v1/self"
	PathInstances      = "/v1/instances"
	PathJoinEndpoints  = "/v1/join-endpoints"
	PathInitSecretHash = "/v1/init-secret-hash"
	PathAPIEndpoint    = "/v1/api-endpoint"
	PathReport         = "/v1/self/report"
)

// Client reads the metadata service.
type Client struct {
	base    *url.URL
	http    *http.Client
	timeout time.Duration
}

var (
	_ metadata.Provider = (*Client)(nil)
	_ metadata.Lister   = (*Client)(nil)
)

// New returns a client of the metadata service at baseURL (http or https, no path beyond
// "/"). httpClient may be nil: a client with DefaultTimeout that follows no redirects.
func New(baseURL string, httpClient *http.Client) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil {
		return nil, fmt.Errorf("metadata service URL %q: %w", baseURL, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
		return nil, fmt.Errorf("metadata service URL %q: want http(s)://host[:port]", baseURL)
	}
	if httpClient == nil {
		httpClient = &http.Client{
			Timeout: DefaultTimeout,
			CheckRedirect: func(*http.Request, []*http.Request) error {
				return errors.New("the metadata service does not redirect")
			},
		}
	}
	return &Client{base: u, http: httpClient, timeout: DefaultTimeout}, nil
}

// instanceJSON is an instance as the metadata service describes it.
type instanceJSON struct {
	Name string   `json:"name"`
	Role string   `json:"role"`
	IPs  []string `json:"ips"`
}

// Self implements metadata.Provider.
func (c *Client) Self(ctx context.Context) (metadata.Instance, error) {
	body, err := c.get(ctx, PathSelf)
	if err != nil {
		return metadata.Instance{}, err
	}
	inst, err := decodeSelf(body)
	if err != nil {
		return metadata.Instance{}, fmt.Errorf("metadata %s: %w", PathSelf, err)
	}
	return inst, nil
}

// Instances implements metadata.Lister.
func (c *Client) Instances(ctx context.Context) ([]metadata.Instance, error) {
	body, err := c.get(ctx, PathInstances)
	if err != nil {
		return nil, err
	}
	list, err := decodeInstances(body)
	if err != nil {
		return nil, fmt.Errorf("metadata %s: %w", PathInstances, err)
	}
	return list, nil
}

// Node returns this node's full record on the local platform: beyond Self, the pod range
// and the cgroup the provider assigned to it (the local bootstrapper needs both).
func (c *Client) Node(ctx context.Context) (metaserver.Node, error) {
	body, err := c.get(ctx, PathSelf)
	if err != nil {
		return metaserver.Node{}, err
	}
	n, err := decodeNode(body)
	if err != nil {
		return metaserver.Node{}, fmt.Errorf("metadata %s: %w", PathSelf, err)
	}
	return n, nil
}

// JoinEndpoints implements metadata.Provider.
func (c *Client) JoinEndpoints(ctx context.Context) ([]string, error) {
	body, err := c.get(ctx, PathJoinEndpoints)
	if err != nil {
		return nil, err
	}
	eps, err := decodeEndpoints(body)
	if err != nil {
		return nil, fmt.Errorf("metadata %s: %w", PathJoinEndpoints, err)
	}
	return eps, nil
}

// APIEndpoint implements metadata.Provider: the provider's API load balancer.
func (c *Client) APIEndpoint(ctx context.Context) (string, error) {
	body, err := c.get(ctx, PathAPIEndpoint)
	if err != nil {
		return "", err
	}
	ep, err := decodeAPIEndpoint(body)
	if err != nil {
		return "", fmt.Errorf("metadata %s: %w", PathAPIEndpoint, err)
	}
	return ep, nil
}

// InitSecretHash implements metadata.Provider.
func (c *Client) InitSecretHash(ctx context.Context) ([]byte, error) {
	body, err := c.get(ctx, PathInitSecretHash)
	if err != nil {
		return nil, err
	}
	hash, err := decodeHash(body)
	if err != nil {
		return nil, fmt.Errorf("metadata %s: %w", PathInitSecretHash, err)
	}
	return hash, nil
}

// Report tells the platform this node's bootstrapper phase (shown to the operator by the
// provider, as a cloud shows guest attributes). Best effort for the caller: the platform
// trusts it for nothing.
func (c *Client) Report(ctx context.Context, phase string) error {
	return c.ReportDetail(ctx, phase, "")
}

// ReportDetail is Report with a line explaining the phase (at most
// metaserver.MaxDetailBytes; the platform shows it escaped).
func (c *Client) ReportDetail(ctx context.Context, phase, detail string) error {
	if len(detail) > metaserver.MaxDetailBytes {
		detail = detail[:metaserver.MaxDetailBytes]
	}
	body, err := json.Marshal(metaserver.Report{Phase: phase, Detail: detail})
	if err != nil {
		return err
	}
	_, err = c.do(ctx, http.MethodPut, PathReport, body, http.StatusNoContent)
	return err
}

func (c *Client) get(ctx context.Context, path string) ([]byte, error) {
	return c.do(ctx, http.MethodGet, path, nil, http.StatusOK)
}

// do makes one request with a JSON body (nil for none) and returns the answer's body, at
// most maxBody bytes, if the status is want.
func (c *Client) do(ctx context.Context, method, path string, body []byte, want int) ([]byte, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	u := c.base.JoinPath(path)
	var reqBody io.Reader
	if body != nil {
		reqBody = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), reqBody)
	if err != nil {
		return nil, fmt.Errorf("metadata %s: %w", path, err)
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("metadata %s: %w", path, err)
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return nil, fmt.Errorf("metadata %s: reading answer: %w", path, err)
	}
	if resp.StatusCode != want {
		return nil, fmt.Errorf("metadata %s: %s: %s", path, resp.Status, snippet(answer))
	}
	if len(answer) > maxBody {
		return nil, fmt.Errorf("metadata %s: answer larger than %d bytes", path, maxBody)
	}
	return answer, nil
}

// snippet is the start of an error body, printable, for messages.
func snippet(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return strconv.Quote(s)
}

func decodeSelf(body []byte) (metadata.Instance, error) {
	var in instanceJSON
	if err := strictjson.UnmarshalIgnoreUnknown(body, &in); err != nil {
		return metadata.Instance{}, fmt.Errorf("decoding instance: %w", err)
	}
	return toInstance(in)
}

func decodeNode(body []byte) (metaserver.Node, error) {
	var n metaserver.Node
	if err := strictjson.UnmarshalIgnoreUnknown(body, &n); err != nil {
		return metaserver.Node{}, fmt.Errorf("decoding node: %w", err)
	}
	var problems []error
	if err := n.Instance().Validate(); err != nil {
		problems = append(problems, err)
	}
	if !n.PodCIDR.IsValid() {
		problems = append(problems, errors.New("no pod range (podCIDR)"))
	}
	// Empty: the node is a machine with a cgroup tree of its own (a QEMU machine).
	if n.CgroupRoot != "" && (!path.IsAbs(n.CgroupRoot) || path.Clean(n.CgroupRoot) != n.CgroupRoot) {
		problems = append(problems, fmt.Errorf("cgroupRoot %q: want a clean absolute path", n.CgroupRoot))
	}
	if len(problems) > 0 {
		return metaserver.Node{}, errors.Join(problems...)
	}
	return n, nil
}

func decodeInstances(body []byte) ([]metadata.Instance, error) {
	var list []instanceJSON
	if err := strictjson.UnmarshalIgnoreUnknown(body, &list); err != nil {
		return nil, fmt.Errorf("decoding instance list: %w", err)
	}
	out := make([]metadata.Instance, 0, len(list))
	seen := map[string]bool{}
	var problems []error
	for i, in := range list {
		inst, err := toInstance(in)
		if err != nil {
			problems = append(problems, fmt.Errorf("instance %d: %w", i, err))
			continue
		}
		if seen[inst.Name] {
			problems = append(problems, fmt.Errorf("instance %d: name %q listed twice", i, inst.Name))
			continue
		}
		seen[inst.Name] = true
		out = append(out, inst)
	}
	if len(problems) > 0 {
		return nil, errors.Join(problems...)
	}
	return out, nil
}

func toInstance(in instanceJSON) (metadata.Instance, error) {
	inst := metadata.Instance{Name: in.Name, Role: metadata.Role(in.Role)}
	var problems []error
	for _, s := range in.IPs {
		ip, err := netip.ParseAddr(s)
		if err != nil {
			problems = append(problems, fmt.Errorf("IP address %q: %w", s, err))
			continue
		}
		inst.IPs = append(inst.IPs, ip)
	}
	if err := inst.Validate(); err != nil {
		problems = append(problems, err)
	}
	if len(problems) > 0 {
		return metadata.Instance{}, errors.Join(problems...)
	}
	return inst, nil
}

func decodeEndpoints(body []byte) ([]string, error) {
	var eps []string
	if err := strictjson.UnmarshalIgnoreUnknown(body, &eps); err != nil {
		return nil, fmt.Errorf("decoding endpoint list: %w", err)
	}
	for _, ep := range eps {
		host, port, err := net.SplitHostPort(ep)
		if err != nil {
			return nil, fmt.Errorf("endpoint %q: %w", ep, err)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || host == "" {
			return nil, fmt.Errorf("endpoint %q: want host:port with a port of 1..65535", ep)
		}
	}
	return eps, nil
}

// decodeAPIEndpoint reads {"endpoint":"IP:port"}, strictly: the endpoint becomes kubeadm's
// controlPlaneEndpoint, so it must be an address and a port (an empty one: the platform has
// no load balancer).
func decodeAPIEndpoint(body []byte) (string, error) {
	var e struct {
		Endpoint *string `json:"endpoint"`
	}
	if err := strictjson.Unmarshal(body, &e); err != nil {
		return "", fmt.Errorf("decoding API endpoint: %w", err)
	}
	if e.Endpoint == nil {
		return "", errors.New("decoding API endpoint: no endpoint field")
	}
	if *e.Endpoint == "" {
		return "", nil
	}
	ap, err := netip.ParseAddrPort(*e.Endpoint)
	if err != nil || ap.Port() == 0 || !ap.Addr().IsValid() || ap.Addr().IsUnspecified() {
		return "", fmt.Errorf("API endpoint %q: want IP:port", *e.Endpoint)
	}
	return ap.String(), nil
}

func decodeHash(body []byte) ([]byte, error) {
	var h struct {
		Hash string `json:"hash"`
	}
	if err := strictjson.UnmarshalIgnoreUnknown(body, &h); err != nil {
		return nil, fmt.Errorf("decoding init-secret hash: %w", err)
	}
	if _, err := bcrypt.Cost([]byte(h.Hash)); err != nil {
		return nil, fmt.Errorf("init-secret hash is not a bcrypt hash: %w", err)
	}
	return []byte(h.Hash), nil
}
