package prism

import (
	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/results"
)

// Placement: high-priority flows skip the bridge and veth backlog on the same core: every stage of a flow stays on one core.
func (mode) Placement() results.Placement { return results.PlacementOneCore }

var _ datapath.Placer = mode{}
