package prism

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath/agentproc"
	"github.com/peregrine-net/peregrine/internal/datapath/bpfobj"
	"github.com/peregrine-net/peregrine/internal/datapath/endpoints"

	"github.com/peregrine-net/peregrine/internal/datapath"
)

// The node agent keeps the endpoint map current as containers come and go, and puts prg_prism_vx
// on VXLAN devices created after attach (and forgets those that left): it re-reads the topology
// on every link change in the host's and the VXLAN devices' namespaces (and every resyncEvery
// as a backstop for namespaces created later) and syncs the maps. Endpoint correctness does not
// depend on it: the kernel drops a vanished veth's devmap slot by itself, so a stale entry can
// only drop, never misdeliver.
//
// It is this same binary run as `peregrine agent prism --target=NS`, detached (see
// internal/datapath/agentproc).

const resyncEvery = time.Second

// agentKit starts, stops and describes the node agent (internal/datapath/agentproc).
const agentKit = agentproc.Agent(Name)

// RunAgent implements datapath.AgentRunner.
func (mode) RunAgent(ctx context.Context, target string) error {
	return agentKit.Run(ctx, target, 0, runAgent)
}

func runAgent(ctx context.Context, st *datapath.State, lg datapath.Logger) error {
	target := st.Target
	objs, err := openPinned(target)
	if err != nil {
		return err
	}
	defer objs.Close()
	w := datapath.Watch{Debounce: 20 * time.Millisecond, Every: resyncEvery, SyncFirst: true, Log: lg,
		Sync: func(context.Context) error { return agentSync(target, objs, lg) }}
	lg.Printf("started")
	lctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { // the gate's asks (ctliberal.go); ends before objs close
		defer close(done)
		if err := runLiberal(lctx, target, objs, lg); err != nil {
			lg.Printf("liberal TCP tracking: %v (HP TCP flows stay on the normal path)", err)
		}
	}()
	defer func() { stop(); <-done }()
	return w.Run(ctx, append([]string{target}, nsOf(st.Topology.ByStage(datapath.StageVXLAN))...))
}

// agentSync is one round of the agent: re-discover, follow the VXLAN devices, sync the
// endpoints.
func agentSync(target string, objs *objects, lg datapath.Logger) error {
	cur, err := datapath.LoadState(target, Name)
	if err != nil || cur == nil || cur.Mode != Name {
		return datapath.ErrNotAttached
	}
	t, err := datapath.Discover(cur.Target, cur.Options.Underlay)
	if err != nil {
		return fmt.Errorf("discover: %w", err)
	}
	if err := followVXLAN(cur, t, objs, lg); err != nil {
		lg.Printf("VXLAN devices: %v", err)
	}
	rep, err := resync(t, objs)
	if err != nil {
		lg.Printf("sync: %v", err)
	} else if rep.Added+rep.Updated+rep.Gone+rep.Expired > 0 {
		lg.Printf("endpoints: %d live, %d added, %d updated, %d gone, %d expired", rep.Live, rep.Added, rep.Updated, rep.Gone, rep.Expired)
	}
	if err := followGate(cur, t, objs, rep.Conflicts, lg); err != nil {
		lg.Printf("gate: %v", err)
	}
	return nil
}

// followGate puts the gate's far end (prg_prism_dlv) on pods that appeared, forgets those that
// left, and records the addresses refused as claimed by several pods (status and /metrics show
// them). Nothing is written when nothing changed.
func followGate(cur *datapath.State, t *datapath.Topology, objs *objects, conflicts []endpoints.Conflict, lg datapath.Logger) error {
	vxs, err := discoverVXLAN(t)
	if err != nil {
		return err
	}
	pods, _ := podPinsOf(t, vxs)
	if ms, err := datapath.LoadModeState[modeState](cur); err == nil && samePods(ms.Pods, pods) && slices.EqualFunc(ms.Conflicts, conflicts, sameConflict) {
		return nil
	}
	return datapath.UpdateState(cur.Target, Name, time.Second, func(st *datapath.State) error {
		ms, err := datapath.LoadModeState[modeState](st)
		if err != nil {
			return err
		}
		var changed bool
		ms.Pods, changed, err = followPods(objs, st.Target, pods, ms.Pods)
		if changed {
			lg.Printf("gate: %d pod devices", len(ms.Pods))
		}
		for _, c := range conflicts {
			if !slices.ContainsFunc(ms.Conflicts, func(o endpoints.Conflict) bool { return sameConflict(o, c) }) {
				ms.ConflictsSeen++
				lg.Printf("endpoint conflict: %s", c)
			}
		}
		ms.Conflicts = conflicts
		datapath.SetModeState(st, ms)
		return err
	})
}

func samePods(a, b []podPin) bool {
	return slices.EqualFunc(a, b, func(x, y podPin) bool { return x.id() == y.id() })
}

func sameConflict(a, b endpoints.Conflict) bool {
	return a.Domain == b.Domain && a.Addr == b.Addr && slices.Equal(a.Veths, b.Veths)
}

func nsOf(ds []datapath.Dev) []string {
	var out []string
	for _, d := range ds {
		out = append(out, d.Netns)
	}
	return out
}

// followVXLAN attaches prg_prism_vx to VXLAN devices that appeared since attach, forgets those
// that left (the kernel detached their links), and with --hp-cpus puts new UDP ports in the
// underlay program's port set. Each change is recorded.
func followVXLAN(cur *datapath.State, t *datapath.Topology, objs *objects, lg datapath.Logger) error {
	vxs, err := discoverVXLAN(t)
	if err != nil {
		return err
	}
	if ms, err := datapath.LoadModeState[modeState](cur); err == nil && !vxlanChanged(ms, vxs, cur.Topology, t) {
		return nil // the usual case: nothing to record
	}
	return datapath.UpdateState(cur.Target, Name, time.Second, func(st *datapath.State) error {
		ms, err := datapath.LoadModeState[modeState](st)
		if err != nil {
			return err
		}
		live, have := map[string]bool{}, map[string]bool{}
		for _, vx := range vxs {
			live[pieceKey(vx.Inode, vx.Dev)] = true
		}
		var keep []piece
		var errs []error
		for _, p := range ms.Pieces {
			if p.NIC || live[pieceKey(p.Inode, p.Dev)] {
				keep, have[pieceKey(p.Inode, p.Dev)] = append(keep, p), true
				continue
			}
			_ = objs.PrgPrismDev.Delete(prsPrgDevKey{Netns: p.Inode, Ifindex: uint32(p.Dev.Ifindex)})
			errs = append(errs, bpfobj.DetachPin(p.LinkPin))
			lg.Printf("VXLAN device %s gone: forgotten", p.Dev)
		}
		ms.Pieces = keep
		for _, vx := range vxs {
			if have[pieceKey(vx.Inode, vx.Dev)] {
				continue
			}
			p, err := attachPiece(objs, st.Target, vx)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			ms.Pieces = append(ms.Pieces, p)
			lg.Printf("VXLAN device %s appeared: attached", vx.Dev)
		}
		var c Config
		err = datapath.RecordedConfig(st, &c)
		if err == nil {
			ms.Firewall, err = followFirewall(vxs, ms.Firewall, c.Conntrack)
		}
		errs = append(errs, err)
		if ms.Isolation != nil && !slices.Equal(t.VXLANPorts, st.Topology.VXLANPorts) {
			ports, err := t.VXLANPortSet()
			if err == nil {
				err = objs.writeIso(ms.Isolation, ports)
			}
			errs = append(errs, err)
		}
		st.Topology = t
		datapath.SetModeState(st, ms)
		return errors.Join(errs...)
	})
}

// vxlanChanged says whether the VXLAN devices or their ports differ from the record's.
func vxlanChanged(ms modeState, vxs []vxlanDev, recorded, now *datapath.Topology) bool {
	have := map[string]bool{}
	for _, p := range ms.Pieces {
		if !p.NIC {
			have[pieceKey(p.Inode, p.Dev)] = true
		}
	}
	for _, vx := range vxs {
		if !have[pieceKey(vx.Inode, vx.Dev)] {
			return true
		}
		delete(have, pieceKey(vx.Inode, vx.Dev))
	}
	return len(have) > 0 || (ms.Isolation != nil && !slices.Equal(recorded.VXLANPorts, now.VXLANPorts))
}

// pieceKey identifies a device across rescans: namespace inode, ifindex, name.
func pieceKey(inode uint32, d datapath.Dev) string {
	return fmt.Sprintf("%d/%d/%s", inode, d.Ifindex, d.Name)
}

// resync re-discovers the endpoints behind the VXLAN devices of t and syncs the maps.
func resync(t *datapath.Topology, objs *objects) (syncReport, error) {
	vxs, err := discoverVXLAN(t)
	if err != nil {
		return syncReport{}, err
	}
	eps, _ := discoverEndpoints(t, vxs)
	return syncEndpoints(objs, eps, time.Now())
}

// Sync brings the endpoint map of target up to date once (what the agent does continuously).
func Sync(target string) (added, updated, gone int, err error) {
	st, err := datapath.Attached(target, Name, 0)
	if err != nil {
		return 0, 0, 0, err
	}
	objs, err := openPinned(target)
	if err != nil {
		return 0, 0, 0, err
	}
	defer objs.Close()
	t, err := datapath.Discover(st.Target, st.Options.Underlay)
	if err != nil {
		return 0, 0, 0, err
	}
	rep, err := resync(t, objs)
	if err == nil {
		err = followGate(st, t, objs, rep.Conflicts, datapath.DiscardLogger())
	}
	return rep.Added, rep.Updated, rep.Gone, err
}
