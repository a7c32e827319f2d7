package fastpath

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/bpfobj"
)

// What the node agent asks of a live fastpath attachment (datapath.Repairer, Upgrader).

// indices are the overlays' Index values.
func indices(ovs []*overlay) []int {
	out := make([]int, len(ovs))
	for i, ov := range ovs {
		out[i] = ov.Index
	}
	return out
}

// linkPins lists the pinned tcx links of target's attachment (file names).
func linkPins(target string) ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(datapath.ModePinDir(target, Name), linksSub))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return out, nil
}

// Repair implements datapath.Repairer: a pinned link that no longer holds its device (detached
// by hand: `bpftool link detach`) loses its pin, and every piece whose pin is missing (also one
// unpinned by hand, which detaches it) is attached again; the others, the maps and so the
// cached flows are untouched. It returns the links it put back.
func (mode) Repair(_ context.Context, st *datapath.State) ([]string, error) {
	ms, err := datapath.LoadModeState[modeState](st)
	ovs := ms.overlays()
	if err != nil || len(ovs) == 0 {
		return nil, errors.Join(errors.New("fastpath: record has no overlay"), err)
	}
	dir := filepath.Join(datapath.ModePinDir(st.Target, Name), linksSub)
	before, err := linkPins(st.Target)
	if err != nil {
		return nil, fmt.Errorf("fastpath: links: %w", err)
	}
	have := map[string]bool{}
	for _, n := range before {
		if !bpfobj.LinkAlive(filepath.Join(dir, n)) {
			_ = os.Remove(filepath.Join(dir, n)) // detached: the pin holds a dead link
			continue
		}
		have[n] = true
	}
	p, err := openPinned(st.Target, indices(ovs)...)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	var errs []error
	for _, ov := range ovs {
		errs = append(errs, attachOverlay(p, st.Target, ov))
	}
	if t, err := datapath.Discover(st.Target, st.Options.Underlay); err == nil {
		for _, ov := range ovs {
			eps, _ := discoverPods(t, ov)
			_, err = attachPods(p, st.Target, ov, eps)
			errs = append(errs, err)
		}
	} else {
		errs = append(errs, err)
	}
	after, _ := linkPins(st.Target)
	var back []string
	for _, n := range after {
		if !have[n] {
			back = append(back, n)
		}
	}
	return back, errors.Join(errs...)
}

// Upgrade implements datapath.Upgrader: the programs of an attachment made by another binary
// are replaced by this binary's where their kernel tag differs, with a bpf_link update on each
// pinned tcx link (atomic: every packet sees the old program or the new one, never none), the
// new programs using the attachment's pinned maps, so cached flows survive. The program pins
// are then replaced, so the agent attaches the new programs to new pods. It must run before the
// attachment's agent opens the programs (the node agent upgrades, then adopts). Maps whose
// layout changed cannot be shared: it fails, and the node agent detaches and attaches fastpath.
func (mode) Upgrade(_ context.Context, st *datapath.State) ([]string, error) {
	dir := datapath.ModePinDir(st.Target, Name)
	if ms, err := datapath.LoadModeState[modeState](st); err == nil && len(ms.overlays()) > 1 {
		// Each overlay runs its own copy of the programs: replacing them link by link is
		// not done here; a detach and attach renews them all.
		return nil, fmt.Errorf("fastpath: %d overlays: %w", len(ms.overlays()), datapath.ErrNeedsReattach)
	}
	addedMaps(dir) // maps this binary added since (new and empty): pinned now, the others kept
	old, err := openPinned(st.Target, 0)
	if err != nil {
		// An attachment of an older layout (a map this binary pins that it lacks).
		return nil, fmt.Errorf("%w: %w", err, datapath.ErrNeedsReattach)
	}
	defer old.Close()
	if err := upgradeU6(old, st); err != nil {
		return nil, err
	}
	spec, err := loadFp()
	if err != nil {
		return nil, fmt.Errorf("fastpath: %w", err)
	}
	// The flow tables were sized at attach (sizeFlowTable): the spec must say the same.
	keepFlowSizes(spec, &old.fpMaps)
	repl := map[string]*ebpf.Map{}
	for name, m := range mapsOf(&old.fpMaps) {
		repl[name] = *m
	}
	var nu fpPrograms
	if err := spec.LoadAndAssign(&nu, &ebpf.CollectionOptions{MapReplacements: repl}); err != nil {
		return nil, fmt.Errorf("fastpath: load this binary's programs over the attachment's maps: %w: %w", err, datapath.ErrNeedsReattach)
	}
	defer nu.Close()
	oldByID := map[ebpf.ProgramID]string{}
	for name, p := range progsOf(&old.fpPrograms) {
		if info, err := p.Info(); err == nil {
			if id, ok := info.ID(); ok {
				oldByID[id] = name
			}
		}
	}
	newProgs := progsOf(&nu)
	changed := map[string]bool{}
	for name, p := range progsOf(&old.fpPrograms) {
		changed[name] = tagOf(p) != tagOf(newProgs[name])
	}
	pins, err := linkPins(st.Target)
	if err != nil {
		return nil, err
	}
	var replaced []string
	var errs []error
	for _, n := range pins {
		l, err := link.LoadPinnedLink(filepath.Join(dir, linksSub, n), nil)
		if err != nil {
			continue // a dead pin: Repair's business
		}
		info, err := l.Info()
		name := ""
		if err == nil {
			name = oldByID[info.Program]
		}
		if name == "" {
			// Not one of the pinned programs (an interrupted earlier upgrade): identify it by
			// its tag among this binary's.
			if p, err := ebpf.NewProgramFromID(info.Program); err == nil {
				for nn, np := range newProgs {
					if tagOf(np) == tagOf(p) {
						name = nn
					}
				}
				p.Close()
			}
		}
		if name != "" && changed[name] {
			if err := l.Update(newProgs[name]); err != nil {
				errs = append(errs, fmt.Errorf("fastpath: update link %s: %w", n, err))
			} else {
				replaced = append(replaced, n+" -> "+name)
			}
		}
		l.Close()
	}
	for name, p := range newProgs {
		if !changed[name] {
			continue
		}
		path := filepath.Join(dir, name)
		tmp := path + "_new" // bpffs refuses names with a dot
		_ = os.Remove(tmp)
		if err := p.Pin(tmp); err != nil {
			errs = append(errs, fmt.Errorf("fastpath: pin %s: %w", name, err))
			continue
		}
		if err := os.Rename(tmp, path); err != nil { // bpffs renames atomically
			errs = append(errs, fmt.Errorf("fastpath: replace pin %s: %w", name, err))
			_ = os.Remove(tmp)
		}
	}
	return replaced, errors.Join(errs...)
}

// upgradeU6 writes the IPv6 underlay's config into the attachment's maps as attach does
// (putU6), before this binary's programs take the links: an attachment made by a binary without
// bpf/fastpath_u6.h gets prg_fastpath_u6cfg and prg_fastpath_u6dev created empty (addedMaps),
// and empty they leave flannel-v6.1's pods on the normal path for good, since the node agent
// writes them only with an overlay's config (a pod count or device change). The record's note
// that the device takes the normal path is replaced as attach replaces it.
func upgradeU6(p *pinned, st *datapath.State) error {
	ms, err := datapath.LoadModeState[modeState](st)
	ovs := ms.overlays()
	if err != nil || len(ovs) == 0 {
		return errors.Join(errors.New("fastpath: record has no overlay"), err)
	}
	ov := ovs[0]
	dev6, err := putU6(p, ov.Underlay.Netns, ov)
	if err != nil || dev6 == "" {
		return err
	}
	return datapath.UpdateState(st.Target, Name, time.Second, func(cur *datapath.State) error {
		cms, err := datapath.LoadModeState[modeState](cur)
		if err != nil {
			return err
		}
		cms.Notes = u6Notes(cms.Notes, dev6, ov)
		datapath.SetModeState(cur, cms)
		return nil
	})
}

func tagOf(p *ebpf.Program) string {
	if p == nil {
		return ""
	}
	info, err := p.Info()
	if err != nil {
		return ""
	}
	return info.Tag
}

// laterMaps are maps added to the objects after attachments were made without them, that
// start empty and change nothing the existing maps mean (IPv6 Service NAT's side table and
// handover record, bpf/fastpath_nat6.h; the learn-event ring and its lost counts,
// bpf/fastpath_learned.h, which the new agent starts with one walk anyway; the IPv6 underlay's
// config, remote VTEPs, device, per-flow headers and count of packets encapsulated in the program, bpf/fastpath_u6.h; the binding of IPv4's handover record,
// bpf/fastpath_nat.h; the counters of reasons added later, prg_fastpath_stat2 and prg_fastpath_stat3): an upgrade in
// place creates and pins them beside the attachment's maps, so its flows and counters survive, where a missing map would otherwise
// make the node agent detach and attach fastpath.
var laterMaps = []string{"prg_fastpath_nat6", "prg_fastpath_ho6", "prg_fastpath_learned",
	"prg_fastpath_learned_lost", "prg_fastpath_u6cfg", "prg_fastpath_vtep6", "prg_fastpath_u6dev",
	"prg_fastpath_hob", "prg_fastpath_stat2", "prg_fastpath_u6tmpl",
	"prg_fastpath_u6enc", "prg_fastpath_stat3"}

// addedMaps creates and pins, in the attachment's pin directory dir, those of laterMaps it
// lacks (sized as its pinned tables: keepFlowSizes). What fails is left out: the upgrade then
// finds the map missing and asks for a reattach, as before.
func addedMaps(dir string) {
	var missing []string
	for _, name := range laterMaps {
		if _, err := os.Stat(filepath.Join(dir, name)); errors.Is(err, os.ErrNotExist) {
			missing = append(missing, name)
		}
	}
	if len(missing) == 0 {
		return
	}
	spec, err := loadFp()
	if err != nil {
		return
	}
	if f6, err := ebpf.LoadPinnedMap(filepath.Join(dir, "prg_fastpath_flow6"), nil); err == nil {
		if ms := spec.Maps["prg_fastpath_nat6"]; ms != nil {
			ms.MaxEntries = f6.MaxEntries() // an entry per IPv6 flow at most (flowTables)
		}
		f6.Close()
	}
	for _, name := range missing {
		ms, ok := spec.Maps[name]
		if !ok {
			continue
		}
		m, err := ebpf.NewMap(ms)
		if err != nil {
			continue
		}
		_ = m.Pin(filepath.Join(dir, name))
		m.Close()
	}
}
