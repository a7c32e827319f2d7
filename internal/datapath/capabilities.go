package datapath

// Optional capabilities of a mode, beside Mode, Reporter and AgentRunner: a mode implements
// the ones it needs in its own package, and the CLI, the bench and the report ask for them
// instead of naming modes.

// BenchContext is what the bench tells a mode about the measurement it is attached for.
type BenchContext struct {
	// Port is the measured workload's server port (0: none in particular).
	Port int
}

// BenchDefaulter is a mode that needs options of its own to be measured without further
// setup (prism: the measured port is high priority; ezpath: a controller quick enough for
// short repetitions). BenchOptions gets the options the user gave and returns the ones to use.
type BenchDefaulter interface {
	BenchOptions(b BenchContext, given map[string]string) map[string]string
}

// Exampler is a mode with command lines to show in `attach MODE --help`.
type Exampler interface {
	Example() string
}
