// Package azuremeta is how a node of an Azure cluster, and the cluster's services, learn
// about the cluster from Azure: the node's own facts from the Instance Metadata Service
// (IMDS), and the cluster's instances from Resource Manager with the nodes' managed identity.
//
// Neither is trusted for security: IMDS is served by the host, and Resource Manager says
// what the cluster's VMs are, not what they run. What a node runs is proven by its
// attestation (docs/azure.md "What the host sees, and what it cannot").
package azuremeta

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"github.com/openconstellation/constellation/internal/metadata"
)

// IMDSURL is Azure's Instance Metadata Service, on the link-local address every VM reaches
// without a route off the host.
const IMDSURL = "http://169.254.169.254"

// imdsAPIVersion is the IMDS API version the client asks for: pinned, so that the answer's
// shape is the one parsed here.
const imdsAPIVersion = "2021-02-01"

// maxIMDSAnswer bounds an IMDS answer (a VM's is a few KiB).
const maxIMDSAnswer = 1 << 20

// Tags the host half (internal/provider/azure) sets on the cluster's resources, which nodes
// and services read. A resource tagged with another cluster's UID is never adopted or
// deleted.
const (
	TagUID  = "constellation-uid"
	TagRole = "constellation-role"
	TagNode = "constellation-node"
	// TagInitSecretHash is the tag of a control plane's VM that holds the bcrypt hash of the
	// cluster's init secret: public (anyone who can read the VM may read it), and what the
	// node compares the init request's secret with. The secret itself never reaches Azure.
	TagInitSecretHash = "constellation-init-secret-hash"
	// TagPodNetwork is a node's pod network (a /24 of the cluster's), routed to the node.
	TagPodNetwork = "constellation-pod-network"
	// TagNodesIdentity and TagVolumesIdentity name a VM's managed identities (in its group):
	// the nodes' (every VM: reads the cluster's instances) and the volumes' (control planes:
	// the volume driver's disks). A VM with two identities must name the one it wants a
	// token of.
	TagNodesIdentity   = "constellation-nodes-identity"
	TagVolumesIdentity = "constellation-volumes-identity"
	// TagAPIEndpoint is the cluster's API endpoint (the load balancer's public address and
	// port): only where to connect; clients verify the API server's certificate.
	TagAPIEndpoint = "constellation-api-endpoint"
)

// IMDS is a client of the Instance Metadata Service.
type IMDS struct {
	// BaseURL is IMDSURL, or a test server's.
	BaseURL string
	// HTTP is the client; nil: one that never uses a proxy (Azure's advice for IMDS) and
	// gives up after 10 s.
	HTTP *http.Client
}

// Instance is what IMDS says about the VM.
type Instance struct {
	Name, Subscription, ResourceGroup, Location string
	// Tags are the VM's tags.
	Tags map[string]string
	// IPs are the primary interface's private addresses.
	IPs []netip.Addr
	// DataDisks are the managed disks attached to the VM, with their LUNs.
	DataDisks []DataDisk
}

// DataDisk is a data disk attached to the VM: its name and the LUN it answers at.
type DataDisk struct {
	Name string
	LUN  int
}

// The LUNs of a VM's data disks: the state disk's (the host half attaches it there), the
// volumes' (from FirstVolumeLUN, azurevolumes), and the largest (Azure's limit: 64 per VM).
const (
	StateLUN       = 0
	FirstVolumeLUN = StateLUN + 1
	MaxLUN         = 63
)

// UID is the cluster's UID the VM is tagged with.
func (i Instance) UID() string { return i.Tags[TagUID] }

// Self is the node as the metadata interface describes it.
func (i Instance) Self() (metadata.Instance, error) {
	name := i.Tags[TagNode]
	if name == "" {
		name = i.Name
	}
	self := metadata.Instance{Name: name, Role: metadata.Role(i.Tags[TagRole]), IPs: i.IPs}
	if err := self.Validate(); err != nil {
		return metadata.Instance{}, fmt.Errorf("IMDS describes VM %s as no node of a cluster: %w", i.Name, err)
	}
	return self, nil
}

// InitSecretHash is the init secret's hash a control plane is tagged with; nil for a worker.
func (i Instance) InitSecretHash() []byte {
	if h := i.Tags[TagInitSecretHash]; h != "" {
		return []byte(h)
	}
	return nil
}

// Instance asks IMDS about the VM.
func (c IMDS) Instance(ctx context.Context) (Instance, error) {
	client := c.HTTP
	if client == nil {
		client = &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 10 * time.Second}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.BaseURL+"/metadata/instance?api-version="+imdsAPIVersion+"&format=json", nil)
	if err != nil {
		return Instance{}, err
	}
	req.Header.Set("Metadata", "true")
	resp, err := client.Do(req)
	if err != nil {
		return Instance{}, fmt.Errorf("asking IMDS about the VM: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxIMDSAnswer+1))
	if err != nil {
		return Instance{}, fmt.Errorf("reading IMDS's answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return Instance{}, fmt.Errorf("IMDS answered %s: %.200s", resp.Status, body)
	}
	return ParseInstance(body)
}

// imdsInstance is the part of IMDS's answer (api-version 2021-02-01) the client reads.
type imdsInstance struct {
	Compute struct {
		Name              string `json:"name"`
		SubscriptionID    string `json:"subscriptionId"`
		ResourceGroupName string `json:"resourceGroupName"`
		Location          string `json:"location"`
		TagsList          []struct {
			Name  string `json:"name"`
			Value string `json:"value"`
		} `json:"tagsList"`
		StorageProfile struct {
			DataDisks []struct {
				LUN  json.RawMessage `json:"lun"` // a number, as a string ("1"); a bare number is taken too
				Name string          `json:"name"`
			} `json:"dataDisks"`
		} `json:"storageProfile"`
	} `json:"compute"`
	Network struct {
		Interface []struct {
			IPv4 struct {
				IPAddress []struct {
					PrivateIPAddress string `json:"privateIpAddress"`
				} `json:"ipAddress"`
			} `json:"ipv4"`
		} `json:"interface"`
	} `json:"network"`
}

// ParseInstance parses IMDS's answer about the VM: its name, group, tags, data disks and the
// primary interface's private addresses. It refuses an answer that is too large, not JSON,
// without a name, with an address that does not parse, or with a data disk without a name or
// a LUN in 0-MaxLUN.
func ParseInstance(body []byte) (Instance, error) {
	if len(body) > maxIMDSAnswer {
		return Instance{}, fmt.Errorf("IMDS's answer has more than %d bytes", maxIMDSAnswer)
	}
	var raw imdsInstance
	if err := json.Unmarshal(body, &raw); err != nil {
		return Instance{}, fmt.Errorf("IMDS's answer: %w", err)
	}
	c := raw.Compute
	if c.Name == "" {
		return Instance{}, errors.New("IMDS's answer names no VM")
	}
	inst := Instance{Name: c.Name, Subscription: c.SubscriptionID, ResourceGroup: c.ResourceGroupName, Location: c.Location, Tags: map[string]string{}}
	for _, t := range c.TagsList {
		inst.Tags[t.Name] = t.Value
	}
	for _, d := range c.StorageProfile.DataDisks {
		lun, err := parseLUN(d.LUN)
		if err != nil || lun < 0 || lun > MaxLUN || d.Name == "" {
			return Instance{}, fmt.Errorf("IMDS's answer: data disk %q at LUN %.20s: want a name and a LUN in 0-%d", d.Name, d.LUN, MaxLUN)
		}
		inst.DataDisks = append(inst.DataDisks, DataDisk{Name: d.Name, LUN: lun})
	}
	if len(raw.Network.Interface) > 0 {
		for _, a := range raw.Network.Interface[0].IPv4.IPAddress {
			ip, err := netip.ParseAddr(a.PrivateIPAddress)
			if err != nil {
				return Instance{}, fmt.Errorf("IMDS's answer: private address %q: %w", a.PrivateIPAddress, err)
			}
			inst.IPs = append(inst.IPs, ip)
		}
	}
	return inst, nil
}

// parseLUN parses a LUN as IMDS writes it, "1", or as a bare number.
func parseLUN(raw json.RawMessage) (int, error) {
	var text string
	if err := json.Unmarshal(raw, &text); err == nil {
		return strconv.Atoi(text)
	}
	var n int
	err := json.Unmarshal(raw, &n)
	return n, err
}
