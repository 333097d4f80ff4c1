package measurements

import (
	"fmt"
	"sync/atomic"

	"github.com/openconstellation/constellation/pkg/attestation/variant"
)

// Active holds the reference sets in force for one variant and lets a watcher swap them while
// validations run (docs/design.md "1.8 Reference values change without a gap": upgrades add
// a set, roll the nodes, then retire the old set).
//
// A validation reads the sets once (Load) and decides against that snapshot. Store is atomic:
// once it returns, no later Load sees a retired set, so a caller that re-checks its decision
// against Load right before acting (as the join service does before issuing a ticket) never
// acts on a retired set.
type Active struct {
	variant variant.Variant
	sets    atomic.Pointer[ReferenceSets]
}

// NewActive validates sets for v and returns them as the active sets.
func NewActive(v variant.Variant, sets ReferenceSets) (*Active, error) {
	a := &Active{variant: v}
	if err := a.Store(sets); err != nil {
		return nil, err
	}
	return a, nil
}

// Variant returns the variant the sets are for.
func (a *Active) Variant() variant.Variant { return a.variant }

// Load returns the sets in force. The caller must not modify them.
func (a *Active) Load() ReferenceSets { return *a.sets.Load() }

// Store validates sets and makes them the sets in force. Invalid sets are refused and the
// previous sets stay in force.
func (a *Active) Store(sets ReferenceSets) error {
	if err := sets.Validate(a.variant); err != nil {
		return fmt.Errorf("reference sets for %s: %w", a.variant, err)
	}
	c := make(ReferenceSets, len(sets))
	copy(c, sets)
	a.sets.Store(&c)
	return nil
}
