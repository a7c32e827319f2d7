package datapath

import "github.com/peregrine-net/peregrine/internal/results"

// Placer is a mode that declares its CPU placement class: how it spreads one flow's receive
// stages over cores. The bench records the class of every config (results.Config.Placement) and
// the projection to bigger machines models it, so neither needs to know the mode. A mode that
// does not implement it is recorded as results.PlacementUnknown, with a note.
type Placer interface {
	Placement() results.Placement
}

// PlacementOf is the class of a stack of modes attached in order (results.StackPlacement), one
// core for none, and the modes of the stack that declare no class (unregistered ones included).
func PlacementOf(stack ...string) (results.Placement, []string) {
	var classes []results.Placement
	var undeclared []string
	for _, name := range stack {
		p, ok := modes[name].(Placer)
		if !ok {
			undeclared = append(undeclared, name)
			classes = append(classes, results.PlacementUnknown)
			continue
		}
		classes = append(classes, p.Placement())
	}
	return results.StackPlacement(classes...), undeclared
}
