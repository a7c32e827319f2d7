package fastpath

import (
	"github.com/peregrine-net/peregrine/internal/datapath"
)

// Placement: the fast path skips stages but steers none: a flow runs to completion on the core that took its interrupt.
func (mode) Placement() datapath.Placement { return datapath.PlacementOneCore }
