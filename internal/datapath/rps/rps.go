// Package rps is the baseline mode: the usual tuning advice, RPS across all CPUs on every stage
// device. Every peregrine mode is compared against it. It changes only rps_cpus masks and loads
// no program.
package rps

import (
	"context"
	"fmt"

	"github.com/peregrine-net/peregrine/internal/cpuset"
	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/option"
)

// Name is the mode's name for attach/detach.
const Name = "rps"

type mode struct{}

func init() { datapath.Register(mode{}) }

func (mode) Name() string { return Name }

// Options: rps takes no options (only --cpus and the framework's own).
func (mode) Options() *option.Schema { return nil }
func (mode) Summary() string {
	return "the usual tuning: RPS across the CPUs on every stage device (underlay, VXLAN, both veth ends)"
}

func (mode) Knobs(t *datapath.Topology, o datapath.Options) ([]datapath.Knob, error) {
	cpus := o.CPUs
	if len(cpus) == 0 {
		var err error
		if cpus, err = cpuset.Online(); err != nil {
			return nil, err
		}
	}
	mask := cpuset.Mask(cpus)
	var ks []datapath.Knob
	for _, d := range t.Devs {
		if d.Stage == datapath.StageNIC && o.KeepUnderlay {
			continue
		}
		paths, err := datapath.RxQueueKnobs(d, "rps_cpus")
		if err != nil {
			return nil, err
		}
		for _, p := range paths {
			ks = append(ks, datapath.Knob{Netns: d.Netns, Path: p, New: mask})
		}
	}
	if len(ks) == 0 {
		return nil, fmt.Errorf("rps: no receive queues found on the overlay devices")
	}
	return ks, nil
}

func (mode) Load(context.Context, *datapath.Topology, datapath.Options, *datapath.State) error {
	return nil
}
func (mode) Unload(context.Context, *datapath.State) error { return nil }

// Placement: RPS hands every packet from the IRQ core to one CPU per flow (the flow hash picks
// it), so a flow's later stages run together on a second core.
func (mode) Placement() datapath.Placement { return datapath.PlacementSecondCore }

// Example shows the mode in `attach --help`.
func (mode) Example() string {
	return `  sudo peregrine attach rps --lab
  sudo peregrine attach rps --netns prg-lab-h2 --cpus 1`
}
