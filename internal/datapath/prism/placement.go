package prism

import (
	"github.com/peregrine-net/peregrine/internal/datapath"
)

// Placement: high-priority flows skip the bridge and veth backlog on the same core: every stage of a flow stays on one core.
func (mode) Placement() datapath.Placement { return datapath.PlacementOneCore }
