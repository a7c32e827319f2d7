package falcon

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/peregrine-net/peregrine/internal/cpuset"
	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/bpfobj"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// Mode is FALCON as a datapath mode.
type Mode struct{}

func init() { datapath.Register(Mode{}) }

// Name is the mode's name.
const Name = "falcon"

func (Mode) Name() string { return Name }

// OptionKeys and Configure make falcon a datapath.Configurer: its options are parsed once.
func (Mode) OptionKeys() []string                      { return optionKeys }
func (Mode) Configure(o datapath.Options) (any, error) { return configOf(o) }
func (Mode) Summary() string {
	return "FALCON: each stage (VXLAN, container veth) of a flow on its own CPU, two-choice balanced, load-gated"
}

// Knobs validates the settings, refuses to stack on another falcon, and plans the RPS knobs of
// every device whose RPS carries a stage transition: the VXLAN devices and the container veths.
// The underlay's own receive CPU is the NIC's (RSS/IRQ affinity) and is left alone.
func (Mode) Knobs(t *datapath.Topology, o datapath.Options) ([]datapath.Knob, error) {
	cfg, err := datapath.ConfigOf(o, configOf)
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
	if err := bpfobj.CheckNoPins(Name, pinDir(t.Host)); err != nil {
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
func (Mode) Load(ctx context.Context, t *datapath.Topology, o datapath.Options, st *datapath.State) error {
	cfg, err := datapath.ConfigOf(o, configOf)
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
	dir := pinDir(st.Target)
	st.Pins = append(st.Pins, dir)
	if err := datapath.SaveState(st); err != nil {
		return err
	}
	if err := objs.pin(dir); err != nil {
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
			datapath.WriteModeState(st, ms)
			return err
		}
		ms.Pieces = append(ms.Pieces, pieces[i])
	}
	datapath.WriteModeState(st, ms)
	if cfg.Split == "on" {
		if err := splitAttach(t, cfg, st); err != nil {
			return err
		}
	}
	if err := datapath.SaveState(st); err != nil {
		return err
	}
	pid, err := startAgent(st.Target)
	if err != nil {
		return err
	}
	st.AgentPID = pid
	if err := datapath.SaveState(st); err != nil {
		return err
	}
	return waitAgentReady(ctx, objs, pid, st.Target)
}

// Unload stops the agent, detaches every piece and the GRO split. The pins themselves (and with
// them the maps) go with the record's Pins, which the framework removes.
func (Mode) Unload(ctx context.Context, st *datapath.State) error {
	var errs []error
	if st.AgentPID > 0 {
		errs = append(errs, stopAgent(st.AgentPID, st.Target))
	}
	errs = append(errs, splitDetach(st))
	ms, err := readModeState(st)
	errs = append(errs, err)
	for _, p := range ms.Pieces {
		errs = append(errs, detachPiece(nil, p))
	}
	return errors.Join(errs...)
}

// RunAgent is `peregrine agent falcon --target NS`.
func (Mode) RunAgent(ctx context.Context, target string) error { return runAgent(ctx, target) }
