package mflow

import (
	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/results"
)

// Placement: a flow is cut into batches after the NIC stage, and the batches' later stages run on all the other CPUs.
func (mode) Placement() results.Placement { return results.PlacementSplitAfterNIC }

var _ datapath.Placer = mode{}
