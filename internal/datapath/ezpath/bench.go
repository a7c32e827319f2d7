package ezpath

import (
	"maps"

	"github.com/peregrine-net/peregrine/internal/datapath"
)

// benchDefaults: the controller offloads the measured pair within a tenth of a second of its
// first traffic (the discarded warm-up) and keeps it offloaded across the interleaved
// repetitions of the other configs (idle timer 60 s).
var benchDefaults = map[string]string{OptPolicy: "auto", OptInterval: "100ms", OptActive: "1", OptIdle: "600", OptMinRate: "1"}

// BenchOptions fills the bench defaults under what the user gave.
func (mode) BenchOptions(_ datapath.BenchContext, given map[string]string) map[string]string {
	m := maps.Clone(benchDefaults)
	maps.Copy(m, given)
	return m
}
