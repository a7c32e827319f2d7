package bench

import (
	"fmt"
	"strings"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/results"
)

// placementOf is the CPU placement class of a config's stack of modes: one core with none
// attached (the kernel's own path runs a flow's stages where its interrupt arrived), else what
// the modes declare (datapath.PlacementOf), with a note when one of them declares nothing.
func placementOf(config string, stack []string) (results.Placement, string) {
	p, undeclared := datapath.PlacementOf(stack...)
	if len(undeclared) == 0 {
		return p, ""
	}
	return p, fmt.Sprintf("placement: config %s is recorded as %s: mode %s declares no CPU placement class (datapath.Placer); the projection models it as one core",
		config, p, strings.Join(undeclared, ", "))
}

// stackOf is the stack of modes a recorded config names ("falcon+prism"), nil for none.
func stackOf(c results.Config) []string {
	if c.Mode == "" || c.Mode == ModeVanilla {
		return nil
	}
	return strings.Split(c.Mode, "+")
}

// FillPlacements gives the configs of runs written before the placement class was recorded the
// class their modes declare in this build, and returns a note per filled run saying so (the
// modes may have changed since the run). Configs measured between given namespaces stay
// unknown. Configs that state a class are left alone.
func FillPlacements(runs ...*results.Run) []string {
	var notes []string
	for _, run := range runs {
		var filled []string
		for i := range run.Configs {
			c := &run.Configs[i]
			if c.Placement != "" {
				continue
			}
			if c.Style == StyleGiven {
				c.Placement = results.PlacementUnknown
			} else {
				c.Placement, _ = placementOf(c.Name, stackOf(*c))
			}
			filled = append(filled, c.Name+" "+string(c.Placement))
		}
		if len(filled) > 0 {
			notes = append(notes, fmt.Sprintf("run %s records no placement classes (an older file): taken from this build's modes: %s",
				run.ID, strings.Join(filled, ", ")))
		}
	}
	return notes
}

// PlacementHelp describes the placement classes and which class each registered mode declares,
// for help texts.
func PlacementHelp() string {
	var parts []string
	for _, m := range datapath.ModeNames() {
		p, _ := datapath.PlacementOf(m)
		parts = append(parts, m+" "+string(p))
	}
	return results.PlacementLegend("  ") + "No mode attached (vanilla, native): " + string(results.PlacementOneCore) +
		". The modes: " + strings.Join(parts, ", ") + "; a stack takes its most spread mode's class.\n"
}
