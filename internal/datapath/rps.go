package datapath

import (
	"context"
	"fmt"

	"github.com/peregrine-net/peregrine/internal/cpuset"
	"github.com/peregrine-net/peregrine/internal/datapath/option"
)

// rpsMode is the usual tuning advice: RPS across all CPUs on every stage device. It is the
// baseline every peregrine mode is compared against. It changes only rps_cpus masks.
type rpsMode struct{}

// ModeRPS is the name of the RPS baseline mode.
const ModeRPS = "rps"

func init() { Register(rpsMode{}) }

func (rpsMode) Name() string { return ModeRPS }

// Options: rps takes no options (only --cpus and the framework's own).
func (rpsMode) Options() *option.Schema { return nil }
func (rpsMode) Summary() string {
	return "the usual tuning: RPS across the CPUs on every stage device (underlay, VXLAN, both veth ends)"
}

func (rpsMode) Knobs(t *Topology, o Options) ([]Knob, error) {
	cpus := o.CPUs
	if len(cpus) == 0 {
		var err error
		if cpus, err = cpuset.Online(); err != nil {
			return nil, err
		}
	}
	mask := cpuset.Mask(cpus)
	var ks []Knob
	for _, d := range t.Devs {
		if d.Stage == StageNIC && o.KeepUnderlay {
			continue
		}
		paths, err := rxQueueKnobs(d, "rps_cpus")
		if err != nil {
			return nil, err
		}
		for _, p := range paths {
			ks = append(ks, Knob{Netns: d.Netns, Path: p, New: mask})
		}
	}
	if len(ks) == 0 {
		return nil, fmt.Errorf("rps: no receive queues found on the overlay devices")
	}
	return ks, nil
}

func (rpsMode) Load(context.Context, *Topology, Options, *State) error { return nil }
func (rpsMode) Unload(context.Context, *State) error                   { return nil }

// Example shows the mode in `attach --help`.
func (rpsMode) Example() string {
	return `  sudo peregrine attach rps --lab
  sudo peregrine attach rps --netns prg-lab-h2 --cpus 1`
}
