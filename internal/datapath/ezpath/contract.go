package ezpath

import "github.com/peregrine-net/peregrine/internal/datapath"

// The mode contract (internal/datapath/contract.go): every capability this mode implements,
// checked by the compiler, so a method whose signature drifts fails the build instead of
// silently dropping the capability.
var (
	_ datapath.Mode           = mode{}
	_ datapath.Reporter       = mode{}
	_ datapath.AgentRunner    = mode{}
	_ datapath.Exampler       = mode{}
	_ datapath.BenchDefaulter = mode{}
	_ datapath.Placer         = mode{}
	_ datapath.ModeCounters   = mode{}
	_ datapath.Commander      = mode{}
	_ datapath.Completer      = (*Config)(nil) // the config type's capability
)
