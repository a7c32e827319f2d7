package datapath

import (
	"errors"
	"fmt"
	"sort"
	"strings"
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

// PlanKnobs reads the current value of each knob (Old) so a mode's agent can record knobs it is
// about to change for a device that appeared after attach.
func PlanKnobs(ks []Knob) error { return readKnobs(ks) }

// ApplyKnobs writes New (or Old with restore) to each knob and returns every failure.
func ApplyKnobs(ks []Knob, restore bool) error { return errors.Join(writeKnobs(ks, restore)...) }

// RxQueueKnobs lists a device's per-receive-queue knob files (rps_cpus, rps_flow_cnt...).
func RxQueueKnobs(d Dev, file string) ([]string, error) { return rxQueueKnobs(d, file) }

var modes = map[string]Mode{}

// Register makes a mode available to attach; called from the mode package's init. A second
// mode of the same name is a programming error that would silently replace the first: it panics,
// naming both.
func Register(m Mode) {
	if old, ok := modes[m.Name()]; ok {
		panic(fmt.Sprintf("datapath.Register: mode %q registered twice (%T, then %T)", m.Name(), old, m))
	}
	modes[m.Name()] = m
}

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
