package etcdmember

import (
	"errors"
	"fmt"
	"net/url"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/openconstellation/constellation/pkg/strictjson"
	"github.com/openconstellation/constellation/pkg/untrusted"
)

// Limits of etcdctl's output that the parsers accept. etcd clusters have a handful of members
// (kubeadm: one per control plane); anything far beyond is not etcdctl talking.
const (
	MaxOutputBytes = 1 << 20
	MaxMembers     = 128
	MaxURLs        = 16
)

// listedMember is a member as `etcdctl member list -w json` prints it (etcdserverpb.Member).
type listedMember struct {
	ID         uint64   `json:"ID"`
	Name       string   `json:"name"`
	PeerURLs   []string `json:"peerURLs"`
	ClientURLs []string `json:"clientURLs"`
	IsLearner  bool     `json:"isLearner"`
}

type header struct {
	ClusterID uint64 `json:"cluster_id"`
	MemberID  uint64 `json:"member_id"`
	Revision  uint64 `json:"revision"`
	RaftTerm  uint64 `json:"raft_term"`
}

// memberList is the output of `etcdctl member list -w json` and `etcdctl member remove -w json`
// (etcdserverpb.MemberListResponse, MemberRemoveResponse).
type memberList struct {
	Header  *header        `json:"header"`
	Members []listedMember `json:"members"`
}

// ParseMemberList parses the output of `etcdctl member list -w json` (and of `member remove`,
// which prints the remaining members the same way). It returns the members, sorted by name
// and ID, and the ID of the member that answered.
//
// Strict: exactly one JSON object of the known fields, in their exact spelling, no key twice;
// a header naming the answering member; every member with a non-zero unique ID, a name that is
// empty (a member added but not started yet) or a unique Kubernetes node name (kubeadm names
// members after their nodes), valid http(s) URLs, and within the size limits.
func ParseMemberList(data []byte) (members []Member, answeredBy uint64, err error) {
	var out memberList
	if err := decodeStrict(data, &out); err != nil {
		return nil, 0, fmt.Errorf("etcdctl member list output: %w", err)
	}
	if out.Header == nil || out.Header.MemberID == 0 || out.Header.ClusterID == 0 {
		return nil, 0, errors.New("etcdctl member list output: no header naming the cluster and the answering member")
	}
	if len(out.Members) > MaxMembers {
		return nil, 0, fmt.Errorf("etcdctl member list output: %d members, more than %d", len(out.Members), MaxMembers)
	}
	ids := map[uint64]bool{}
	names := map[string]bool{}
	for i, m := range out.Members {
		if m.ID == 0 {
			return nil, 0, fmt.Errorf("etcdctl member list output: member %d has no ID", i)
		}
		if ids[m.ID] {
			return nil, 0, fmt.Errorf("etcdctl member list output: member ID %x listed twice", m.ID)
		}
		ids[m.ID] = true
		if m.Name != "" {
			if errs := validation.IsDNS1123Subdomain(m.Name); len(errs) > 0 {
				return nil, 0, fmt.Errorf("etcdctl member list output: member %x: name %s is not a node name", m.ID, untrusted.Quote(m.Name))
			}
			if names[m.Name] {
				return nil, 0, fmt.Errorf("etcdctl member list output: member name %q listed twice", m.Name)
			}
			names[m.Name] = true
		}
		if len(m.PeerURLs) == 0 {
			return nil, 0, fmt.Errorf("etcdctl member list output: member %x has no peer URL", m.ID)
		}
		for _, urls := range [][]string{m.PeerURLs, m.ClientURLs} {
			if err := checkURLs(urls); err != nil {
				return nil, 0, fmt.Errorf("etcdctl member list output: member %x: %w", m.ID, err)
			}
		}
		members = append(members, Member{
			ID: m.ID, Name: m.Name, PeerURLs: m.PeerURLs, ClientURLs: m.ClientURLs, IsLearner: m.IsLearner,
		})
	}
	if !ids[out.Header.MemberID] {
		return nil, 0, fmt.Errorf("etcdctl member list output: answered by member %x, which is not listed", out.Header.MemberID)
	}
	sortMembers(members)
	return members, out.Header.MemberID, nil
}

// EndpointHealth is one entry of `etcdctl endpoint health -w json`.
type EndpointHealth struct {
	Endpoint string `json:"endpoint"`
	Health   bool   `json:"health"`
	// Took is how long the check took, as etcdctl prints it ("2.659068ms").
	Took  string `json:"took"`
	Error string `json:"error"`
}

// ParseEndpointHealth parses the output of `etcdctl endpoint health -w json`: a JSON array of
// endpoint results, each with a valid http(s) endpoint named once and a duration; an
// unhealthy endpoint says why.
func ParseEndpointHealth(data []byte) ([]EndpointHealth, error) {
	var out []EndpointHealth
	if err := decodeStrict(data, &out); err != nil {
		return nil, fmt.Errorf("etcdctl endpoint health output: %w", err)
	}
	if out == nil {
		return nil, errors.New("etcdctl endpoint health output: not a list")
	}
	if len(out) > MaxMembers*MaxURLs {
		return nil, fmt.Errorf("etcdctl endpoint health output: %d endpoints, more than %d", len(out), MaxMembers*MaxURLs)
	}
	seen := map[string]bool{}
	for i, h := range out {
		if err := checkURL(h.Endpoint); err != nil {
			return nil, fmt.Errorf("etcdctl endpoint health output: entry %d: %w", i, err)
		}
		if seen[h.Endpoint] {
			return nil, fmt.Errorf("etcdctl endpoint health output: endpoint %s listed twice", h.Endpoint)
		}
		seen[h.Endpoint] = true
		if d, err := time.ParseDuration(h.Took); err != nil || d < 0 {
			return nil, fmt.Errorf("etcdctl endpoint health output: endpoint %s: took %s is not a duration", h.Endpoint, untrusted.Quote(h.Took))
		}
		if !h.Health && h.Error == "" {
			return nil, fmt.Errorf("etcdctl endpoint health output: endpoint %s is unhealthy without a reason", h.Endpoint)
		}
	}
	return out, nil
}

func checkURLs(urls []string) error {
	if len(urls) > MaxURLs {
		return fmt.Errorf("%d URLs, more than %d", len(urls), MaxURLs)
	}
	for _, u := range urls {
		if err := checkURL(u); err != nil {
			return err
		}
	}
	return nil
}

func checkURL(s string) error {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Hostname() == "" ||
		u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || len(s) > 512 {
		return fmt.Errorf("URL %s is not an http(s) endpoint", untrusted.Quote(s))
	}
	return nil
}

// decodeStrict decodes exactly one JSON value from data into v: at most MaxOutputBytes, then
// strictjson.Unmarshal (no unknown field, no field twice or in other letter case, nothing
// after the value).
func decodeStrict(data []byte, v any) error {
	if len(data) > MaxOutputBytes {
		return fmt.Errorf("%d bytes, more than %d", len(data), MaxOutputBytes)
	}
	return strictjson.Unmarshal(data, v)
}
