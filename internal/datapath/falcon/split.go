package falcon

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/bpfobj"
	"github.com/peregrine-net/peregrine/internal/datapath/grosplit"
)

// FALCON's third mechanism, softirq splitting ("GRO split"), cuts the NIC stage in two: skb
// allocation on the IRQ core, GRO and the rest on a split CPU. grosplit carries it (XDP + cpumap
// on the underlay); with --split on falcon attaches it to every underlay device of the node.
//
// --split auto leaves it off at attach; the agent turns it on while the NIC stage saturates its
// core and off when it cools (autosplit.go).

func splitAttach(t *datapath.Topology, cfg Config, st *datapath.State) error {
	ms, err := datapath.LoadModeState[modeState](st)
	if err != nil {
		return err
	}
	for _, d := range t.ByStage(datapath.StageNIC) {
		pins, err := grosplit.Attach(grosplit.Config{Netns: d.Netns, Device: d.Name, CPUs: cfg.SplitCPUs,
			PinDir: filepath.Join(datapath.PinDir(st.Target), "grosplit-"+bpfobj.Sanitize(d.Name))})
		ms.SplitPins = append(ms.SplitPins, pins...)
		datapath.SetModeState(st, ms)
		if err != nil {
			return fmt.Errorf("falcon: GRO split on %s: %w", d, err)
		}
	}
	return nil
}

func splitDetach(st *datapath.State) error {
	ms, err := datapath.LoadModeState[modeState](st)
	if err != nil || len(ms.SplitPins) == 0 {
		return err
	}
	if err := grosplit.Detach(ms.SplitPins); err != nil {
		return errors.Join(fmt.Errorf("falcon: detach GRO split"), err)
	}
	return nil
}
