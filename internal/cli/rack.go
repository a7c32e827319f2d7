package cli

import (
	"github.com/peregrine-net/peregrine/internal/datapath/ezpath"
	"github.com/peregrine-net/peregrine/internal/lab"
)

// EZPath offloads to the ToR switches of a `lab up --tor` lab: the CLI, which links both, tells
// the mode how to open one (the mode itself does not depend on the lab).
func init() { ezpath.UseRacks(openLabRack) }

func openLabRack(name string) (ezpath.Rack, error) {
	r, err := lab.OpenRack(name)
	if err != nil {
		return nil, err
	}
	return r, nil
}
