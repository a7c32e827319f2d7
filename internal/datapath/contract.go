package datapath

import (
	"context"
	"io"

	"github.com/spf13/cobra"

	"github.com/peregrine-net/peregrine/internal/datapath/option"
)

// The mode contract, on one page: Mode, which every mode implements, and every optional
// capability a mode may add. Who asks for each is named beside it; nobody outside a mode's
// package names the mode itself. Every mode asserts each capability it implements at compile
// time (`var _ datapath.Reporter = mode{}` in its contract.go), so a method whose signature
// drifts fails the build instead of silently dropping the capability; modes/contract_test.go
// also fails for a method named like a capability with another signature.

// Mode is one datapath mode. The framework discovers the topology, reads and records every
// knob the mode plans, writes them, then lets the mode load its programs; detach undoes it in
// the reverse order from the record alone. Register it in the mode package's init.
type Mode interface {
	Name() string
	Summary() string
	// Options is the mode's option declaration (option.Declare on its config type), or nil for
	// a mode that takes none. Everything that sets options (attach's flags, bench strings, the
	// agent's config file) is derived from it and parsed through Configure.
	Options() *option.Schema
	// Knobs plans the sysfs/procfs files to change (New filled in; Old is read by the framework).
	Knobs(t *Topology, o Options) ([]Knob, error)
	// Load attaches the mode's programs after the knobs are set, recording pins in st.
	Load(ctx context.Context, t *Topology, o Options, st *State) error
	// Unload removes what Load attached, from the record alone (a new process may call it).
	Unload(ctx context.Context, st *State) error
}

// Reporter is a mode that can describe its live state for `peregrine status`.
type Reporter interface {
	Report(st *State) (string, error)
}

// AgentRunner is a mode with a node agent: `peregrine agent MODE --target NS` runs it in the
// foreground until it is told to stop (the mode's Load starts it detached).
type AgentRunner interface {
	RunAgent(ctx context.Context, target string) error
}

// Exampler is a mode with command lines to show in `attach MODE --help`.
type Exampler interface {
	Example() string
}

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

// Placer is a mode that declares its CPU placement class: how it spreads one flow's receive
// stages over cores. The bench records the class of every config (results.Config.Placement) and
// the projection to bigger machines models it, so neither needs to know the mode. A mode that
// does not implement it is recorded as PlacementUnknown, with a note.
type Placer interface {
	Placement() Placement
}

// StageSteerer is a mode that places the later receive stages of every flow (the VXLAN device
// and the container veth) on CPUs itself and owns those devices' RPS knobs: a mode stacked on
// it leaves those stages alone (StageSteererOn). The method only marks the capability.
type StageSteerer interface {
	SteersLaterStages()
}

// Repairer is a mode that checks its pieces on a live attachment and puts back one that
// vanished (a tcx link detached or unpinned by hand), without touching the others. It returns
// what it put back. The node agent (internal/agent) calls it on every reconcile.
type Repairer interface {
	Repair(ctx context.Context, st *State) ([]string, error)
}

// LiveConfigurer is a mode that applies a changed config to a live attachment (prism's rules).
// applied false means the change needs a new attach (nothing was changed).
type LiveConfigurer interface {
	ApplyConfig(ctx context.Context, st *State, next any) (applied bool, err error)
}

// Upgrader is a mode that replaces the programs of an attachment made by an older binary with
// this binary's, atomically (bpf_link update: never a moment without a program), when they
// differ. It returns what it replaced.
type Upgrader interface {
	Upgrade(ctx context.Context, st *State) ([]string, error)
}

// ModeCounters is a mode that exports its own counters for `/metrics` (internal/metrics):
// packets by direction and result ({direction, result} -> count) and the sizes of its tables
// (table -> entries).
type ModeCounters interface {
	Counters(st *State) (packets map[[2]string]uint64, entries map[string]int, err error)
}

// Completer is not a mode's but its config type's capability: a config that also depends on
// the framework's settings (attach's --cpus) or on the machine (online CPUs). Configure calls it
// on the parsed config, before anything is discovered or changed.
type Completer interface {
	Complete(o Options) error
}

// Commander is a mode with a command tree of its own under the CLI's root (`peregrine prism
// rules|add|del|sync`, `peregrine ezpath offload|unoffload|flows`): the CLI adds the tree
// Commands returns, so only the mode's package names the mode. The commands are declared in the
// mode package itself (they are thin over its exported API); what they need of the CLI comes in
// host, so the mode depends on neither the CLI nor the lab.
type Commander interface {
	Commands(host CLIHost) *cobra.Command
}

// CLIHost is what the CLI lends a mode's commands.
type CLIHost struct {
	// AddTargetFlags adds the flags every command on attachments shares (--netns, --lab,
	// --name) to c and returns what resolves them, when the command runs, into the host
	// namespaces to work on.
	AddTargetFlags func(c *cobra.Command) (resolve func() ([]string, error))
	// DefaultLab is the lab name a --name flag defaults to.
	DefaultLab string
	// PrintJSON writes v for machines, as every --json of the CLI does.
	PrintJSON func(w io.Writer, v any) error
}
