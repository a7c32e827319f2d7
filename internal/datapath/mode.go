package datapath

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/peregrine-net/peregrine/internal/datapath/option"
)

// Options are the settings shared by all modes; modes read their own keys from Extra.
type Options struct {
	Underlay string // override discovery of the underlay device
	CPUs     []int  // CPUs the mode may steer to; empty = all online CPUs
	// KeepUnderlay leaves the underlay's receive knobs alone: in the lab they stand in for the
	// NIC's RSS/IRQ affinity ("hardware"), which no software mode should rewrite.
	KeepUnderlay bool
	// Lab names the lab whose hosts are the targets (attach --lab), for modes that work on a
	// lab's switches; "" on a real node.
	Lab   string
	Extra map[string]string
	// Config is the mode's typed config, parsed from the above by the framework (Configure,
	// ConfigOf); nil for a mode without options.
	Config any `json:"-"`
}

// Mode is one datapath mode. The framework discovers the topology, reads and records every
// knob the mode plans, writes them, then lets the mode load its programs; detach undoes it in
// the reverse order from the record alone.
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

// PlanKnobs reads the current value of each knob (Old) so a mode's agent can record knobs it is
// about to change for a device that appeared after attach.
func PlanKnobs(ks []Knob) error { return readKnobs(ks) }

// ApplyKnobs writes New (or Old with restore) to each knob and returns every failure.
func ApplyKnobs(ks []Knob, restore bool) error { return errors.Join(writeKnobs(ks, restore)...) }

// RxQueueKnobs lists a device's per-receive-queue knob files (rps_cpus, rps_flow_cnt...).
func RxQueueKnobs(d Dev, file string) ([]string, error) { return rxQueueKnobs(d, file) }

var modes = map[string]Mode{}

// Register makes a mode available to attach.
func Register(m Mode) { modes[m.Name()] = m }

// Lookup finds a mode by name with an error listing the known ones.
func Lookup(name string) (Mode, error) {
	if m, ok := modes[name]; ok {
		return m, nil
	}
	return nil, fmt.Errorf("unknown mode %q: choose one of %s", name, strings.Join(ModeNames(), ", "))
}

// ModeNames lists the registered modes.
func ModeNames() []string {
	var ns []string
	for n := range modes {
		ns = append(ns, n)
	}
	sort.Strings(ns)
	return ns
}

// Modes returns every registered mode, sorted by name.
func Modes() []Mode {
	var ms []Mode
	for _, n := range ModeNames() {
		ms = append(ms, modes[n])
	}
	return ms
}
