package falcon

import (
	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/results"
)

// Placement: each stage of a flow (VXLAN, the container's veth) may be steered to a CPU of its own, chosen per stage.
func (mode) Placement() results.Placement { return results.PlacementStagePerCore }

var _ datapath.Placer = mode{}
