package fastpath

import (
	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/results"
)

// Placement: the fast path skips stages but steers none: a flow runs to completion on the core that took its interrupt.
func (mode) Placement() results.Placement { return results.PlacementOneCore }

var _ datapath.Placer = mode{}
