package falcon

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/peregrine-net/peregrine/internal/cpuset"
	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/bpfobj"
	"github.com/peregrine-net/peregrine/internal/datapath/option"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// mode is FALCON as a datapath mode.
type mode struct{}

func init() { datapath.Register(mode{}) }

// Name is the mode's name.
const Name = "falcon"

func (mode) Name() string { return Name }

// Options declares falcon's options (Config).
func (mode) Options() *option.Schema { return schema }
func (mode) Summary() string {
	return "FALCON: each stage (VXLAN, container veth) of a flow on its own CPU, two-choice balanced, load-gated"
}

// Knobs validates the settings, refuses to stack on another falcon, and plans the RPS knobs of
// every device whose RPS carries a stage transition: the VXLAN devices and the container veths.
// The underlay's own receive CPU is the NIC's (RSS/IRQ affinity) and is left alone.
func (mode) Knobs(t *datapath.Topology, o datapath.Options) ([]datapath.Knob, error) {
	cfg, err := configOf(o)
	if err != nil {
		return nil, err
	}
	if err := checkNotAttached(t); err != nil {
		return nil, err
	}
	mask := cpuset.Mask(cfg.CPUs)
	var ks []datapath.Knob
	for _, d := range t.Devs {
		if d.Stage != datapath.StageVXLAN && d.Stage != datapath.StageVeth {
			continue
		}
		dk, err := stageKnobs(d, mask)
		if err != nil {
			return nil, err
		}
		ks = append(ks, dk...)
	}
	return ks, nil
}

// checkNotAttached refuses when falcon's pins for the target exist or a prg_falcon program
// already sits on one of the devices falcon would use. Nothing has been changed when it is called.
func checkNotAttached(t *datapath.Topology) error {
	if err := bpfobj.CheckNoPins(Name, datapath.ModePinDir(t.Host, Name)); err != nil {
		return err
	}
	for _, d := range t.Devs {
		if d.Stage != datapath.StageNIC && d.Stage != datapath.StageVethHost {
			continue
		}
		if names := bpfobj.ProgramsOn(d.Netns, d.Ifindex, d.Stage == datapath.StageVethHost, "prg_falcon"); len(names) > 0 {
			return fmt.Errorf("falcon: %s already runs %s from another attachment: falcon does not stack with itself; detach that one first", d, strings.Join(names, ", "))
		}
	}
	return nil
}

// Load loads and pins the programs, attaches them to the underlay (ingress) and every bridge
// port (egress), and starts the node agent that runs the load monitor and follows containers.
func (mode) Load(ctx context.Context, t *datapath.Topology, o datapath.Options, st *datapath.State) error {
	cfg, err := configOf(o)
	if err != nil {
		return err
	}
	ports, err := t.VXLANPortSet()
	if err != nil {
		return fmt.Errorf("falcon: %w", err)
	}
	objs, err := loadObjects()
	if err != nil {
		return err
	}
	defer objs.Close()
	if err := objs.writeConfig(cfg, ports); err != nil {
		return err
	}
	// Closed until the agent's first load sample says there is room.
	if err := objs.writeGate(Gate{Open: false, Epoch: 1}); err != nil {
		return err
	}
	dir := datapath.ModePinDir(st.Target, Name)
	if err := datapath.RecordThenCreate(st, dir, func() error { return objs.pin(dir) }); err != nil {
		return err
	}
	pieces, notes, err := desiredPieces(t)
	if err != nil {
		return err
	}
	t.Notes = append(t.Notes, notes...)
	var ms modeState
	var nss netnsutil.Set // the pieces share a few namespaces: each is opened once
	defer nss.Close()
	for i := range pieces {
		ns, err := nss.Open(pieces[i].Dev.Netns)
		if err == nil {
			err = attachPieceIn(objs, ns, st.Target, &pieces[i])
		}
		if err != nil {
			datapath.SetModeState(st, ms)
			return err
		}
		ms.Pieces = append(ms.Pieces, pieces[i])
	}
	datapath.SetModeState(st, ms)
	if cfg.Split == "on" {
		if err := splitAttach(t, cfg, st); err != nil {
			return err
		}
	}
	if err := datapath.SaveState(st); err != nil {
		return err
	}
	if err := agentKit.Start(st); err != nil {
		return err
	}
	if err := datapath.SaveState(st); err != nil {
		return err
	}
	return waitAgentReady(ctx, objs, st)
}

// Unload stops the agent, detaches every piece and the GRO split. The pins themselves (and with
// them the maps) go with the record's Pins, which the framework removes.
func (mode) Unload(ctx context.Context, st *datapath.State) error {
	errs := []error{agentKit.Stop(st), splitDetach(st)}
	ms, err := datapath.LoadModeState[modeState](st)
	errs = append(errs, err)
	for _, p := range ms.Pieces {
		errs = append(errs, detachPiece(nil, p))
	}
	return errors.Join(errs...)
}

// SteersLaterStages marks falcon a datapath.StageSteerer: it places the VXLAN and container
// veth stages of every flow itself, so a mode stacked on it (mflow) leaves them alone.
func (mode) SteersLaterStages() {}

// RunAgent is `peregrine agent falcon --target NS`. The record is saved before the agent starts;
// it waits a moment in case the attaching process's write is not visible yet, rather than
// failing the attach.
func (mode) RunAgent(ctx context.Context, target string) error {
	return agentKit.Run(ctx, target, time.Second, runAgent)
}

// Example shows the mode in `attach --help`.
func (mode) Example() string {
	return `  sudo peregrine attach falcon --lab --cpus 0-1 --threshold 85 --interval 20ms
  sudo peregrine attach falcon --static                          # first choice only (no two-choice balancing)
  sudo peregrine attach falcon --lab --split-cpus 1 --split auto # GRO split only while the NIC core saturates`
}
