package falcon

import (
	"github.com/peregrine-net/peregrine/internal/datapath"
)

// Placement: each stage of a flow (VXLAN, the container's veth) may be steered to a CPU of its own, chosen per stage.
func (mode) Placement() datapath.Placement { return datapath.PlacementStagePerCore }
