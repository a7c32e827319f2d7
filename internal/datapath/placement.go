package datapath

import (
	"fmt"
	"slices"
	"strings"
)

// Placement is a config's CPU placement class: how it may spread one flow's receive stages
// (NIC, VXLAN, veth, ...) over cores. The projection of a run to machines with more cores models
// each class (report.Project). A datapath mode declares its class (Placer); the bench records the
// class of each config's stack of modes in results.Config.Placement, so that a reader of the file
// needs no knowledge of the modes. It lives here, with the contract, so the datapath core does not
// import the bench's schema; internal/results aliases it.
type Placement string

// The placement classes, from least to most spread.
const (
	// PlacementOneCore: every stage of a flow runs on the core that took its interrupt (run
	// to completion): the kernel's default path, and modes that steer no stage.
	PlacementOneCore Placement = "one-core"
	// PlacementSecondCore: the NIC stage on the IRQ core, the later stages together on a
	// second core (receive packet steering).
	PlacementSecondCore Placement = "second-core"
	// PlacementStagePerCore: each stage of a flow may get a core of its own.
	PlacementStagePerCore Placement = "stage-per-core"
	// PlacementSplitAfterNIC: the NIC stage on the IRQ core, the later stages split batch-wise
	// over all the other cores.
	PlacementSplitAfterNIC Placement = "split-after-nic"
	// PlacementUnknown: a config whose class is not known (a mode that declares none, given
	// namespaces measured as found). The projection models it as one core and says so.
	PlacementUnknown Placement = "unknown"
)

// placementOrder lists the known classes from least to most spread (StackPlacement's order).
var placementOrder = []Placement{PlacementOneCore, PlacementSecondCore, PlacementStagePerCore, PlacementSplitAfterNIC}

var placementText = map[Placement]string{
	PlacementOneCore:       "every stage of a flow on one core",
	PlacementSecondCore:    "the NIC stage on the IRQ core, the later stages on a second core",
	PlacementStagePerCore:  "each stage of a flow on a core of its own",
	PlacementSplitAfterNIC: "the NIC stage on the IRQ core, the later stages split over the other cores",
	PlacementUnknown:       "not known: modelled as one core",
}

// Known reports whether p is one of the classes the projection models (not unknown, not empty,
// not a class a newer peregrine wrote).
func (p Placement) Known() bool { return slices.Contains(placementOrder, p) }

// Describe says what the class means, for legends and help texts.
func (p Placement) Describe() string {
	if t, ok := placementText[p]; ok {
		return t
	}
	return fmt.Sprintf("%q is not a class this peregrine knows: modelled as one core", string(p))
}

// PlacementLegend describes every class, one "class: meaning" per line, indented by indent.
func PlacementLegend(indent string) string {
	var b strings.Builder
	for _, p := range append(slices.Clone(placementOrder), PlacementUnknown) {
		fmt.Fprintf(&b, "%s%s: %s\n", indent, p, p.Describe())
	}
	return b.String()
}

// StackPlacement is the class of modes stacked on one config: the most spread class any of
// them has (a mode that steers nothing does not undo another's steering), one core for no mode
// at all, and unknown when any of them is unknown (the stack's behaviour is then not known).
func StackPlacement(classes ...Placement) Placement {
	best := PlacementOneCore
	for _, c := range classes {
		if !c.Known() {
			return PlacementUnknown
		}
		if slices.Index(placementOrder, c) > slices.Index(placementOrder, best) {
			best = c
		}
	}
	return best
}

// PlacementOf is the class of a stack of modes attached in order (StackPlacement), one core for
// none, and the modes of the stack that declare no class (unregistered ones included).
func PlacementOf(stack ...string) (Placement, []string) {
	var classes []Placement
	var undeclared []string
	for _, name := range stack {
		p, ok := modes[name].(Placer)
		if !ok {
			undeclared = append(undeclared, name)
			classes = append(classes, PlacementUnknown)
			continue
		}
		classes = append(classes, p.Placement())
	}
	return StackPlacement(classes...), undeclared
}
