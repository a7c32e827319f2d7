package results

import "github.com/peregrine-net/peregrine/internal/datapath"

// Placement is a config's CPU placement class (datapath.Placement: declared with the mode
// contract, so the datapath core does not import this schema). The names below keep this
// package's callers as they were.
type Placement = datapath.Placement

// The placement classes, from least to most spread (datapath's).
const (
	PlacementOneCore       = datapath.PlacementOneCore
	PlacementSecondCore    = datapath.PlacementSecondCore
	PlacementStagePerCore  = datapath.PlacementStagePerCore
	PlacementSplitAfterNIC = datapath.PlacementSplitAfterNIC
	PlacementUnknown       = datapath.PlacementUnknown
)

// PlacementLegend describes every class, one "class: meaning" per line, indented by indent.
func PlacementLegend(indent string) string { return datapath.PlacementLegend(indent) }

// StackPlacement is the class of modes stacked on one config (datapath.StackPlacement).
func StackPlacement(classes ...Placement) Placement { return datapath.StackPlacement(classes...) }
