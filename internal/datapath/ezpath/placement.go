package ezpath

import (
	"github.com/peregrine-net/peregrine/internal/datapath"
)

// Placement: the hosts skip their VXLAN stack for offloaded flows and steer nothing: a flow stays on one core.
func (mode) Placement() datapath.Placement { return datapath.PlacementOneCore }
