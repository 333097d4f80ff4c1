package state

import (
	"fmt"
	"slices"
	"strings"

	"github.com/openconstellation/constellation/internal/metadata"
)

// DiskOwner is one of the cluster's disk-owner records (internal/diskowner): the disk
// (lower-case UUID) belongs to Node.
type DiskOwner struct {
	Disk string
	Node string
}

// DiskReport says what RecordDisks changed and what it refused to change.
type DiskReport struct {
	// Recorded are the disks recorded for nodes that had none ("node: disk").
	Recorded []string
	// Replaced are the disks replaced because an administrator deleted the old disk's
	// record in the cluster and the cluster records exactly one other disk for the node.
	Replaced []string
	// Problems are disagreements between the cluster's records and this file that
	// RecordDisks left as they are, each naming the node, the disks and what to do.
	Problems []string
}

// Changed reports whether the state changed (and must be written).
func (r DiskReport) Changed() bool { return len(r.Recorded)+len(r.Replaced) > 0 }

// RecordDisks copies each node's disk from the cluster's disk-owner records into s, so that
// `constellation recover` knows it while the cluster (and its records) are down.
//
// A node's disk is recorded when the cluster records exactly one disk for it and that disk
// is no other node's here. A recorded disk is kept whatever the cluster says now: a node
// whose disk changed is suspicious (a disk swapped or cloned from another node, a planted
// record), so disagreements are reported in Problems and change nothing. The one exception
// is an administrator's deliberate act: the old disk's record was deleted from the cluster
// (the join service cannot delete records; an administrator re-provisioning a disk does, see
// docs/joinservice.md) and the cluster records exactly one disk for the node; the
// replacement is reported in Replaced. Records of nodes that are not in s (removed nodes)
// are ignored.
func (s *State) RecordDisks(records []DiskOwner) DiskReport {
	var r DiskReport
	owner := map[string]string{}    // disk → node, by the cluster
	ofNode := map[string][]string{} // node → disks, by the cluster
	for _, rec := range records {
		owner[rec.Disk] = rec.Node
		ofNode[rec.Node] = append(ofNode[rec.Node], rec.Disk)
	}
	here := map[string]string{} // disk → node, by this file
	for _, n := range s.Nodes {
		if n.Disk != "" {
			here[n.Disk] = n.Name
		}
	}
	for i := range s.Nodes {
		n := &s.Nodes[i]
		disks := ofNode[n.Name]
		slices.Sort(disks)
		list := strings.Join(disks, ", ")
		if n.Disk == "" {
			switch {
			case len(disks) == 0:
				if n.Role == metadata.ControlPlane && !n.Unexpected {
					r.Problems = append(r.Problems, fmt.Sprintf("%s: the cluster records no disk for this control plane (yet: it has not joined, or the cluster predates disk-owner records); recover would refuse it", n.Name))
				}
			case len(disks) > 1:
				r.Problems = append(r.Problems, fmt.Sprintf("%s: the cluster records %d disks for this node (%s), none was recorded here: recover refuses it until one remains (an interrupted first join or a replaced disk leaves a stale record: delete the record of the disk the node does not hold, configmap disk-<UUID> in namespace constellation-disks)", n.Name, len(disks), list))
			case here[disks[0]] != "":
				r.Problems = append(r.Problems, fmt.Sprintf("%s: the cluster records disk %s as this node's, but this file records it as %s's: nothing changed", n.Name, disks[0], here[disks[0]]))
			default:
				n.Disk = disks[0]
				here[n.Disk] = n.Name
				r.Recorded = append(r.Recorded, n.Name+": "+n.Disk)
			}
			continue
		}
		replaceHint := fmt.Sprintf("if its disk was replaced on purpose, delete the record of %s in the cluster (configmap disk-%s in namespace constellation-disks) and the next refresh records the new one", n.Disk, n.Disk)
		switch o := owner[n.Disk]; {
		case o == n.Name && len(disks) == 1:
		case o == n.Name:
			r.Problems = append(r.Problems, fmt.Sprintf("%s: the cluster records other disks for this node too (%s); kept %s: recover sends it only that disk's key; %s", n.Name, list, n.Disk, replaceHint))
		case o != "":
			r.Problems = append(r.Problems, fmt.Sprintf("%s: the cluster records disk %s, this node's here, as %s's: kept; recover sends %s only that disk's key. Find out how the record changed", n.Name, n.Disk, o, n.Name))
		case len(disks) == 0:
			r.Problems = append(r.Problems, fmt.Sprintf("%s: the cluster no longer records disk %s for this node, nor any other: kept %s", n.Name, n.Disk, n.Disk))
		case len(disks) > 1:
			r.Problems = append(r.Problems, fmt.Sprintf("%s: the cluster no longer records disk %s and records %d others for this node (%s): kept %s; delete the records of the disks it does not hold", n.Name, n.Disk, len(disks), list, n.Disk))
		case here[disks[0]] != "":
			r.Problems = append(r.Problems, fmt.Sprintf("%s: the cluster records disk %s for this node, which this file records as %s's: kept %s", n.Name, disks[0], here[disks[0]], n.Disk))
		default:
			r.Replaced = append(r.Replaced, fmt.Sprintf("%s: disk changed from %s to %s (the record of %s was deleted from the cluster, which records %s for this node)", n.Name, n.Disk, disks[0], n.Disk, disks[0]))
			delete(here, n.Disk)
			n.Disk = disks[0]
			here[n.Disk] = n.Name
		}
	}
	return r
}

// NodeByDisk returns the node this file records disk for.
func (s *State) NodeByDisk(disk string) (Node, bool) {
	for _, n := range s.Nodes {
		if n.Disk != "" && n.Disk == disk {
			return n, true
		}
	}
	return Node{}, false
}
