package falcon

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/peregrine-net/peregrine/internal/cpuset"
	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/probe"
)

// The node agent: FALCON's load monitor (the prototype's do_timer hook) and the follower of
// containers that come and go after attach.
//
//   - every interval it samples /proc/stat, keeps the EWMA of each CPU's busy share
//     (load = 0.8 load + 0.2 busy, the prototype's (4 load + busy)/5), writes it to
//     prg_falcon_load and opens the gate while the average over the FALCON CPUs is below the
//     threshold; each re-opening bumps the epoch, so flows re-pick with fresh loads;
//   - it listens to netlink link events in the host namespace and those of the overlay bridges,
//     and re-runs discovery (debounced, and every second as a backstop for namespaces created
//     after attach) to attach bridge ports that appeared, forget those that left, and steer VXLAN
//     devices created after attach (their RPS knobs, their UDP port in the programs' port set);
//     every knob it changes is recorded in the attachment record before it is written;
//   - it exits when the attachment's pins disappear (detach, lab down) or on SIGTERM.

const (
	rescanDebounce = 100 * time.Millisecond
	rescanBackstop = time.Second // catches namespaces created after attach, missed events
	pinCheck       = time.Second
)

type agent struct {
	target string
	cfg    Config
	objs   *objects
	log    datapath.Logger
	epoch  uint32
	open   bool
	split  splitController // --split auto
}

func runAgent(ctx context.Context, st *datapath.State, lg datapath.Logger) error {
	target := st.Target
	cfg, err := ConfigOfState(st)
	if err != nil {
		return err
	}
	objs, err := openPinned(target, true)
	if err != nil {
		return err
	}
	defer objs.Close()
	g, _ := objs.readGate()
	a := &agent{target: target, cfg: cfg, objs: objs, log: lg, epoch: g.Epoch}
	lg.Printf("started: CPUs %v, threshold %d%%, two-choice %v, interval %v, load signal %s", cfg.CPUs, cfg.Threshold, cfg.TwoChoice, cfg.Interval, cfg.loadSignal())

	mon, err := probe.NewLoadMonitor(cfg.Interval, ewmaAlpha)
	if err != nil {
		return err
	}
	if err := mon.SetSignal(cfg.loadSignal()); err != nil {
		return err
	}
	if s, err := probe.ReadCPUStat(); err == nil {
		_ = mon.Observe(s)
	}
	tick := time.NewTicker(cfg.Interval)
	defer tick.Stop()
	pins := time.NewTicker(pinCheck)
	defer pins.Stop()
	// Rescans (discovery walks every namespace) run beside the load sampling, never in its way.
	detached := make(chan struct{})
	w := datapath.Watch{Debounce: rescanDebounce, Every: rescanBackstop, Log: lg,
		Sync: func(context.Context) error { return a.rescan() }}
	go func() {
		if errors.Is(w.Run(ctx, watchedNamespaces(st.Topology)), datapath.ErrNotAttached) {
			close(detached)
		}
	}()
	for {
		select {
		case <-ctx.Done():
			// Leave the stages where vanilla runs them while nobody watches the load.
			_ = objs.writeGate(Gate{Open: false, Epoch: a.epoch, UpdatedNs: monoNow()})
			return nil
		case <-detached:
			return datapath.ErrNotAttached
		case <-tick.C:
			if err := a.sample(mon); err != nil {
				lg.Printf("load sample: %v", err)
			}
		case <-pins.C:
			if _, err := os.Stat(filepath.Join(datapath.ModePinDir(target, Name), "prg_falcon_gate")); err != nil {
				lg.Printf("pins are gone (detached): exiting")
				return nil
			}
		}
	}
}

// sample feeds the monitor and writes loads and the gate.
func (a *agent) sample(mon *probe.LoadMonitor) error {
	s, err := probe.ReadCPUStat()
	if err != nil {
		return err
	}
	if err := mon.Observe(s); err != nil && !errors.Is(err, probe.ErrEmptyInterval) && !errors.Is(err, probe.ErrCPUSetChanged) {
		return err
	}
	if a.cfg.Split == "auto" {
		a.autoSplit(s)
	}
	cur := mon.Current()
	for cpu, v := range cur {
		if cpu >= MaxCPUID {
			break
		}
		if err := a.objs.PrgFalconLoad.Put(uint32(cpu), pct(v)); err != nil {
			return fmt.Errorf("write load of CPU %d: %w", cpu, err)
		}
	}
	avg := mon.Average(a.cfg.CPUs)
	// NaN (no sample yet) keeps the gate closed.
	open := !math.IsNaN(avg) && pct(avg) < uint32(a.cfg.Threshold)
	if open && !a.open {
		a.epoch++ // a deliberate re-pick point: every flow chooses again with fresh loads
	}
	a.open = open
	g := Gate{Open: open, Epoch: a.epoch, UpdatedNs: monoNow()}
	if !math.IsNaN(avg) {
		g.AvgPct = pct(avg)
	}
	return a.objs.writeGate(g)
}

func pct(share float64) uint32 {
	if math.IsNaN(share) || share <= 0 {
		return 0
	}
	if share >= 1 {
		return 100
	}
	return uint32(math.Round(share * 100))
}

// monoNow is CLOCK_MONOTONIC in ns, the clock of bpf_ktime_get_ns.
func monoNow() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Sec)*1e9 + uint64(ts.Nsec)
}

// watchedNamespaces are where the overlay's devices are (where bridge ports come and go).
func watchedNamespaces(t *datapath.Topology) []string {
	nss := []string{t.Host}
	for _, d := range t.Devs {
		if d.Stage == datapath.StageVXLAN || d.Stage == datapath.StageVethHost {
			nss = append(nss, d.Netns)
		}
	}
	return nss
}

// rescan re-discovers the node and reconciles the bridge ports falcon is attached to.
func (a *agent) rescan() error {
	var underlay string
	if st, err := datapath.LoadState(a.target, Name); err == nil && st != nil {
		underlay = st.Options.Underlay
	}
	topo, err := datapath.Discover(a.target, underlay)
	if err != nil {
		return err
	}
	want, _, err := desiredPieces(topo)
	if err != nil {
		return err
	}
	mask := cpuset.Mask(a.cfg.CPUs)
	return datapath.UpdateState(a.target, Name, 2*time.Second, func(st *datapath.State) error {
		ms, err := datapath.LoadModeState[modeState](st)
		if err != nil {
			return err
		}
		wantKeys := map[string]bool{}
		for _, p := range want {
			wantKeys[p.key()] = true
		}
		var errs []error
		var keep []Piece
		have := map[string]bool{}
		for _, p := range ms.Pieces {
			if p.Stage != StageIDVeth || wantKeys[p.key()] {
				keep = append(keep, p)
				have[p.key()] = true
				continue
			}
			// The port left: forget its link and restore or drop its peer's knobs.
			errs = append(errs, detachPiece(a.objs, p))
			st.Knobs = a.dropKnobs(st.Knobs, p.Next)
			a.log.Printf("port %s gone: detached", p.Dev)
		}
		ms.Pieces = keep
		errs = append(errs, a.followVXLAN(st, topo, mask)...)
		for _, p := range want {
			if p.Stage != StageIDVeth || have[p.key()] {
				continue
			}
			ks, err := stageKnobs(p.Next, mask)
			if err == nil {
				err = datapath.PlanKnobs(ks)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", p.Next, err))
				continue
			}
			// Recorded before written: a crash from here on is undone by detach.
			st.Knobs = append(st.Knobs, ks...)
			if err := datapath.SaveState(st); err != nil {
				return err
			}
			if err := datapath.ApplyKnobs(ks, false); err != nil {
				errs = append(errs, err)
			}
			if err := attachPiece(a.objs, a.target, &p); err != nil {
				errs = append(errs, err)
				continue
			}
			ms.Pieces = append(ms.Pieces, p)
			a.log.Printf("port %s (peer %s) appeared: attached", p.Dev, p.Next)
		}
		datapath.SetModeState(st, ms)
		return errors.Join(errs...)
	})
}

// followVXLAN steers VXLAN devices that appeared after attach (RPS knobs recorded, then
// written) and puts new UDP ports in the programs' port set. The config entry is rewritten
// whole with only the ports changed: a packet that reads it mid-update sees old or new ports,
// both valid.
func (a *agent) followVXLAN(st *datapath.State, topo *datapath.Topology, mask string) []error {
	var errs []error
	for _, d := range topo.ByStage(datapath.StageVXLAN) {
		if mine, _ := knobsOf(st.Knobs, d); len(mine) > 0 {
			continue
		}
		ks, err := stageKnobs(d, mask)
		if err == nil {
			err = datapath.PlanKnobs(ks)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", d, err))
			continue
		}
		st.Knobs = append(st.Knobs, ks...)
		if err := datapath.SaveState(st); err != nil {
			return append(errs, err)
		}
		errs = append(errs, datapath.ApplyKnobs(ks, false))
		a.log.Printf("VXLAN device %s appeared: steered", d)
	}
	if !slices.Equal(topo.VXLANPorts, st.Topology.VXLANPorts) {
		ports, err := topo.VXLANPortSet()
		if err == nil {
			err = a.objs.writeConfig(a.cfg, ports)
		}
		if err != nil {
			return append(errs, err)
		}
		a.log.Printf("VXLAN ports now %v", ports)
	}
	st.Topology = topo
	return errs
}

// knobsOf splits ks into the knobs of device d and the others.
func knobsOf(ks []datapath.Knob, d datapath.Dev) (mine, rest []datapath.Knob) {
	prefix := "/sys/class/net/" + d.Name + "/"
	for _, k := range ks {
		if k.Netns == d.Netns && strings.HasPrefix(k.Path, prefix) {
			mine = append(mine, k)
		} else {
			rest = append(rest, k)
		}
	}
	return mine, rest
}

// dropKnobs removes the knobs of a device from the record, first restoring them if the device
// is still there (the port left the bridge but the veth lives on).
func (a *agent) dropKnobs(ks []datapath.Knob, d datapath.Dev) []datapath.Knob {
	mine, rest := knobsOf(ks, d)
	if err := datapath.ApplyKnobs(mine, true); err != nil {
		a.log.Printf("restore knobs of %s: %v", d, err)
	}
	return slices.Clip(rest)
}
