package mflow

import (
	"github.com/peregrine-net/peregrine/internal/datapath"
)

// Placement: a flow is cut into batches after the NIC stage, and the batches' later stages run on all the other CPUs.
func (mode) Placement() datapath.Placement { return datapath.PlacementSplitAfterNIC }
