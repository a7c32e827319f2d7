package datapath

import "github.com/peregrine-net/peregrine/internal/results"

// Placement: RPS hands every packet from the IRQ core to one CPU per flow (the flow hash picks
// it), so a flow's later stages run together on a second core.
func (rpsMode) Placement() results.Placement { return results.PlacementSecondCore }

var _ Placer = rpsMode{}
