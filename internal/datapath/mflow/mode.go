package mflow

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"

	"github.com/peregrine-net/peregrine/internal/cpuset"
	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/bpfobj"
	"github.com/peregrine-net/peregrine/internal/datapath/grosplit"
	"github.com/peregrine-net/peregrine/internal/datapath/option"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
	"github.com/peregrine-net/peregrine/internal/probe"
)

// mode is MFLOW as a datapath mode.
type mode struct{}

func init() { datapath.Register(mode{}) }

// Name is the mode's name.
const Name = "mflow"

func (mode) Name() string { return Name }

// Options declares mflow's options (Config).
func (mode) Options() *option.Schema { return schema }
func (mode) Summary() string {
	return "MFLOW: elephant flows cut into micro-flows (batches) processed on several CPUs; IRQ split (XDP) or device split"
}

// modeState is mflow's part of the attachment record.
type modeState struct {
	Config    Config   `json:"config"`
	SplitPins []string `json:"split_pins,omitempty"` // grosplit's pins, every underlay
	SplitDirs []string `json:"split_dirs,omitempty"`
	Links     []string `json:"links,omitempty"` // tcx link pins
	// Receivers are the container namespaces whose reordering counters status reports, with
	// their values at attach.
	Receivers map[string]map[string]int64 `json:"receivers,omitempty"`
	// SoftnetDropped is every CPU's backlog drop count at attach: device scaling and merge add
	// backlog (RPS) queues, whose overflow drops only show there.
	SoftnetDropped map[int]uint64 `json:"softnet_dropped,omitempty"`
}

// tcxTarget is one tcx program to attach.
type tcxTarget struct {
	prog   *ebpf.Program
	egress bool
	dev    datapath.Dev
}

// reorderCounters are what status shows of each receiving container.
var reorderCounters = []string{"TcpExt.TCPOFOQueue", "TcpExt.TCPSACKReorder", "TcpExt.TCPTSReorder",
	"TcpExt.TCPDSACKRecv", "Tcp.RetransSegs", "TcpExt.TCPSpuriousRTOs"}

func configOf(o datapath.Options) (Config, error) { return datapath.ConfigOf[Config](Name, o) }

// Knobs validates, refuses to stack, and plans the RPS masks (see the package doc).
func (mode) Knobs(t *datapath.Topology, o datapath.Options) ([]datapath.Knob, error) {
	c, err := configOf(o)
	if err != nil {
		return nil, err
	}
	if err := bpfobj.CheckNoPins(Name, datapath.ModePinDir(t.Host, Name)); err != nil {
		return nil, err
	}
	nics := t.ByStage(datapath.StageNIC)
	if len(nics) == 0 {
		return nil, fmt.Errorf("mflow: no underlay device found behind %s (give it with --underlay)", t.Host)
	}
	irq, err := irqCPUs(nics)
	if err != nil {
		return nil, err
	}
	note, err := checkOverlap(c, irq)
	if err != nil {
		return nil, err
	}
	if note != "" {
		t.Notes = append(t.Notes, note)
	}
	// Together with a mode that steers the later stages (datapath.StageSteerer: falcon, attached
	// first): mflow splits the NIC stage, the other keeps placing the later stages (VXLAN,
	// container veth) one CPU per flow and stage, so mflow leaves their knobs to it; its pinning
	// already merges each flow's batches, and device scaling would fight it over the VXLAN
	// device's RPS.
	steerer, err := datapath.StageSteererOn(t.Host)
	if err != nil {
		return nil, err
	}
	if steerer != "" {
		if c.SplitAt == SplitDevice {
			return nil, fmt.Errorf("mflow: --split-at device steers the VXLAN stage, which %s (attached to %s) already does: use --split-at full-path together with %s", steerer, t.Host, steerer)
		}
		if c.Merge {
			return nil, fmt.Errorf("mflow: --merge is redundant with %s attached: %s keeps each flow on one CPU per stage", steerer, steerer)
		}
		t.Notes = append(t.Notes, fmt.Sprintf("mflow: %s is attached: mflow splits the NIC stage, %s places the VXLAN and veth stages", steerer, steerer))
	}
	mask := cpuset.Mask(c.CPUs)
	var ks []datapath.Knob
	add := func(d datapath.Dev, file, v string) error {
		paths, err := datapath.RxQueueKnobs(d, file)
		if err != nil {
			return err
		}
		for _, p := range paths {
			ks = append(ks, datapath.Knob{Netns: d.Netns, Path: p, New: v})
		}
		return nil
	}
	for _, d := range t.Devs {
		var err error
		if steerer != "" && (d.Stage == datapath.StageVXLAN || d.Stage == datapath.StageVeth) {
			continue // the steerer's
		}
		switch {
		case d.Stage == datapath.StageNIC && c.SplitAt == SplitFullPath:
			// RPS runs again on the skb the split CPU built and would send the whole flow back
			// to the RPS CPU. In a lab the mask stands for the NIC's IRQ affinity: with XDP the
			// IRQ split replaces it (the XDP program runs where the frames arrive).
			if o.KeepUnderlay {
				t.Notes = append(t.Notes, fmt.Sprintf("mflow: %s: the underlay's rps_cpus (the lab's IRQ-core emulation) is cleared while the IRQ split is attached, or RPS would gather each split flow on one CPU again; XDP runs where the frames arrive (with a veth underlay: the sender's CPU)", d))
			}
			err = add(d, "rps_cpus", "0")
		case d.Stage == datapath.StageVXLAN && c.SplitAt == SplitDevice:
			if err = add(d, "rps_cpus", mask); err == nil {
				err = add(d, "rps_flow_cnt", "0") // RFS would follow the app, not the batch hash
			}
		case d.Stage == datapath.StageVXLAN:
			err = add(d, "rps_cpus", "0") // later stages follow the split CPU
		case d.Stage == datapath.StageVeth && c.Merge:
			if err = add(d, "rps_cpus", mask); err == nil {
				err = add(d, "rps_flow_cnt", "0")
			}
		case d.Stage == datapath.StageVeth:
			err = add(d, "rps_cpus", "0")
		}
		if err != nil {
			return nil, err
		}
	}
	return ks, nil
}

// irqCPUs are the CPUs the underlay's receive runs on as far as software can tell: its RPS mask
// (a lab's IRQ emulation, or a tuned node). Unknown (no RPS) gives nil.
func irqCPUs(nics []datapath.Dev) ([]int, error) {
	var out []int
	for _, d := range nics {
		paths, err := datapath.RxQueueKnobs(d, "rps_cpus")
		if err != nil {
			return nil, err
		}
		for _, p := range paths {
			v, err := netnsutil.ReadFileIn(d.Netns, p)
			if err != nil {
				return nil, fmt.Errorf("mflow: read %s:%s: %w", d.Netns, p, err)
			}
			cpus, err := cpuset.FromMask(v)
			if err != nil {
				return nil, fmt.Errorf("mflow: %s:%s: %w", d.Netns, p, err)
			}
			for _, c := range cpus {
				if !slices.Contains(out, c) {
					out = append(out, c)
				}
			}
		}
	}
	return out, nil
}

// Load attaches the split (XDP or tcx), the merge pieces, and records it all.
func (mode) Load(ctx context.Context, t *datapath.Topology, o datapath.Options, st *datapath.State) error {
	c, err := configOf(o)
	if err != nil {
		return err
	}
	ms := modeState{Config: c}
	dir := datapath.ModePinDir(st.Target, Name)
	st.Pins = append(st.Pins, dir) // removed by the framework after Unload
	if err := datapath.SaveModeState(st, ms); err != nil {
		return err
	}
	ports, err := t.VXLANPortSet()
	if err != nil {
		return fmt.Errorf("mflow: %w", err)
	}
	nics := t.ByStage(datapath.StageNIC)
	var shared *ebpf.Map // the XDP split's flow map, for the merge program
	if c.SplitAt == SplitFullPath {
		for _, d := range nics {
			sd := splitDir(st.Target, d.Name)
			pins, err := grosplit.Attach(grosplit.Config{Netns: d.Netns, Device: d.Name, CPUs: c.CPUs, PinDir: sd,
				QueueSize: c.QueueSize, VXLANPorts: ports,
				MFlow: &grosplit.MFlow{Batch: c.Batch, ElephantPPS: c.ElephantPPS, ElephantBPS: c.ElephantBPS,
					Window: c.Window, MiceAffine: c.MiceAffine}})
			ms.SplitPins = append(ms.SplitPins, pins...)
			ms.SplitDirs = append(ms.SplitDirs, sd)
			if serr := datapath.SaveModeState(st, ms); serr != nil {
				return errors.Join(err, serr)
			}
			if err != nil {
				return fmt.Errorf("mflow: IRQ split on %s: %w", d, err)
			}
		}
		if c.watchesPorts() {
			if len(nics) > 1 {
				t.Notes = append(t.Notes, "mflow: several underlays: --merge and the reorder guard see the elephants of the first one only")
			}
			if shared, err = ebpf.LoadPinnedMap(filepath.Join(ms.SplitDirs[0], "prg_gs_mflows"), nil); err != nil {
				return fmt.Errorf("mflow: open the split's flow map: %w", err)
			}
			defer shared.Close()
		}
	}
	if c.SplitAt == SplitDevice || c.watchesPorts() {
		objs, err := loadObjects(shared)
		if err != nil {
			return err
		}
		defer objs.Close()
		if err := writeConfig(objs.PrgMfCfg, c, ports); err != nil {
			return err
		}
		var notOurs []string // the split's flow map is pinned by the split
		if shared != nil {
			notOurs = append(notOurs, mapFlows)
		}
		if err := bpfobj.Pin(Name, dir, objs, notOurs...); err != nil {
			return err
		}
		var targets []tcxTarget
		if c.SplitAt == SplitDevice {
			for _, d := range nics {
				targets = append(targets, tcxTarget{objs.PrgMflowDev, false, d})
			}
		}
		if c.watchesPorts() {
			for _, d := range t.ByStage(datapath.StageVethHost) {
				targets = append(targets, tcxTarget{objs.PrgMflowPort, true, d})
			}
		}
		for _, tg := range targets {
			ino, err := netnsutil.Inode(netnsutil.Path(tg.dev.Netns))
			if err != nil {
				return fmt.Errorf("mflow: namespace of %s: %w", tg.dev, err)
			}
			pin := bpfobj.LinkPin(dir, ino, tg.dev.Ifindex, tg.dev.Name, "")
			if err := bpfobj.AttachTCX(tg.prog, tg.dev.Netns, tg.dev.Ifindex, tg.egress, pin); err != nil {
				return fmt.Errorf("mflow: %s: %w", tg.dev, err)
			}
			ms.Links = append(ms.Links, pin)
			if err := datapath.SaveModeState(st, ms); err != nil {
				return err
			}
		}
	}
	ms.Receivers = map[string]map[string]int64{}
	for _, d := range t.ByStage(datapath.StageVeth) {
		if cs, err := probe.ReadNstat(d.Netns); err == nil {
			ms.Receivers[d.Netns] = pick(cs)
		}
	}
	if sn, err := probe.ReadSoftnet(); err == nil {
		ms.SoftnetDropped = map[int]uint64{}
		for _, r := range sn.PerCPU {
			ms.SoftnetDropped[r.CPU] = r.Dropped
		}
	}
	return datapath.SaveModeState(st, ms)
}

func pick(cs probe.Counters) map[string]int64 {
	out := map[string]int64{}
	for _, n := range reorderCounters {
		if v, ok := cs.Get(n); ok {
			out[n] = v
		}
	}
	return out
}

// Unload detaches the tcx links, then the XDP split; the pin directory goes with st.Pins.
func (mode) Unload(ctx context.Context, st *datapath.State) error {
	ms, err := datapath.LoadModeState[modeState](st)
	errs := []error{err}
	links := ms.Links
	for _, p := range bpfobj.LinkPins(datapath.ModePinDir(st.Target, Name)) { // pins a crash left out of the record
		if !slices.Contains(links, p) {
			links = append(links, p)
		}
	}
	for _, p := range links {
		errs = append(errs, bpfobj.DetachPin(p))
	}
	pins := ms.SplitPins
	if entries, err := os.ReadDir(datapath.ModePinDir(st.Target, Name)); err == nil {
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), "xdp-") {
				for _, p := range grosplit.Pins(filepath.Join(datapath.ModePinDir(st.Target, Name), e.Name())) {
					if !slices.Contains(pins, p) {
						pins = append(pins, p)
					}
				}
			}
		}
	}
	if len(pins) > 0 {
		errs = append(errs, grosplit.Detach(pins))
	}
	return errors.Join(errs...)
}

// Example shows the mode in `attach --help`.
func (mode) Example() string {
	return `  sudo peregrine attach mflow --lab --cpus 0-1 --batch 256 --elephant-pps 10000
  sudo peregrine attach mflow --split-at device --merge`
}
