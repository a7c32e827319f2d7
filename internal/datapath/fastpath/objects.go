package fastpath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/endpoints"
	"github.com/peregrine-net/peregrine/internal/netnsutil"
)

// Pin layout under datapath.ModePinDir: maps and programs by their kernel names (what bpftool
// shows), tcx links in links/.
const linksSub = "links"

// cfg.flags and flow.flags, as in bpf/fastpath.bpf.c.
const (
	cOn     = 1
	cDocker = 2
	cRouted = 4
	cUnsup  = 8
	cOneWay = 16

	fOut = 1
	fIn  = 2
)

// markFast is FP_MARK: frames the fast path redirected carry it until its learner clears it.
const markFast = 0x0fa57000

func loadObjects() (*fpObjects, error) {
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("fastpath: raise memlock limit: %w", err)
	}
	spec, err := loadFp()
	if err != nil {
		return nil, fmt.Errorf("fastpath: %w", err)
	}
	if err := sizeFlowTable(spec); err != nil {
		return nil, err
	}
	var o fpObjects
	if err := spec.LoadAndAssign(&o, nil); err != nil {
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			return nil, fmt.Errorf("fastpath: verifier rejected a program: %+v", verr)
		}
		return nil, fmt.Errorf("fastpath: load eBPF objects (needs Linux 6.6+ for tcx): %w", err)
	}
	return &o, nil
}

func mapsOf(m *fpMaps) map[string]**ebpf.Map {
	return map[string]**ebpf.Map{"prg_fastpath_cfg": &m.PrgFastpathCfg, "prg_fastpath_flow": &m.PrgFastpathFlow,
		"prg_fastpath_stat": &m.PrgFastpathStat, "prg_fastpath_ep": &m.PrgFastpathEp, "prg_fastpath_port": &m.PrgFastpathPort,
		"prg_fastpath_ho": &m.PrgFastpathHo, "prg_fastpath_pcnt": &m.PrgFastpathPcnt, "prg_fastpath_sweep": &m.PrgFastpathSweep,
		"prg_fastpath_closed": &m.PrgFastpathClosed,
		"prg_fastpath_flow6":  &m.PrgFastpathFlow6, "prg_fastpath_sweep6": &m.PrgFastpathSweep6,
		// IPv6 Service NAT (bpf/fastpath_nat6.h): the 128-bit addresses of translated flows
		// and their aliases, and the per-CPU handover record of IPv6 frames.
		"prg_fastpath_nat6": &m.PrgFastpathNat6, "prg_fastpath_ho6": &m.PrgFastpathHo6,
		// TCP flows learned both ways, for the agent's liberal marking (bpf/fastpath_learned.h).
		"prg_fastpath_learned": &m.PrgFastpathLearned, "prg_fastpath_learned_lost": &m.PrgFastpathLearnedLost,
		// The IPv6 underlay (bpf/fastpath_u6.h): its local VTEP and the flows' remote ones, and
		// the device the sending half hands frames to.
		"prg_fastpath_u6cfg": &m.PrgFastpathU6cfg, "prg_fastpath_vtep6": &m.PrgFastpathVtep6,
		"prg_fastpath_u6dev": &m.PrgFastpathU6dev,
		// The IPv6 underlay's whole header per flow, for packets encapsulated in the program.
		"prg_fastpath_u6tmpl": &m.PrgFastpathU6tmpl, "prg_fastpath_u6enc": &m.PrgFastpathU6enc,
		// Which frame IPv4's handover record is (fastpath_nat.h's fp_hob).
		"prg_fastpath_hob": &m.PrgFastpathHob,
		// Counter reasons added after prg_fastpath_stat's size was pinned (fastpath.h FP_R2_N),
		// and after prg_fastpath_stat2's was (FP_R3_CAP).
		"prg_fastpath_stat2": &m.PrgFastpathStat2, "prg_fastpath_stat3": &m.PrgFastpathStat3}
}

func progsOf(p *fpPrograms) map[string]*ebpf.Program {
	return map[string]*ebpf.Program{"prg_fastpath_tx": p.PrgFastpathTx, "prg_fastpath_rx": p.PrgFastpathRx,
		"prg_fastpath_lrn_tx": p.PrgFastpathLrnTx, "prg_fastpath_lrn_rx": p.PrgFastpathLrnRx,
		"prg_fastpath_dtx": p.PrgFastpathDtx, "prg_fastpath_drx": p.PrgFastpathDrx, "prg_fastpath_dlrn_tx": p.PrgFastpathDlrnTx}
}

// loadOverlayPrograms loads the copy of the programs that serves overlay ovl (fp_ovl, see
// bpf/fastpath.h) over the maps m: every copy shares the flow, pod, config, counter and handover
// maps.
func loadOverlayPrograms(m *fpMaps, ovl int) (*fpPrograms, error) {
	spec, err := loadFp()
	if err != nil {
		return nil, fmt.Errorf("fastpath: %w", err)
	}
	v, ok := spec.Variables["fp_ovl"]
	if !ok {
		return nil, errors.New("fastpath: the programs have no fp_ovl")
	}
	if err := v.Set(uint32(ovl)); err != nil {
		return nil, fmt.Errorf("fastpath: set fp_ovl: %w", err)
	}
	// The flow tables were sized at attach (sizeFlowTable): the spec must say the same.
	keepFlowSizes(spec, m)
	repl := map[string]*ebpf.Map{}
	for name, mp := range mapsOf(m) {
		repl[name] = *mp
	}
	var progs fpPrograms
	if err := spec.LoadAndAssign(&progs, &ebpf.CollectionOptions{MapReplacements: repl}); err != nil {
		return nil, fmt.Errorf("fastpath: load the programs of overlay %d: %w", ovl, err)
	}
	return &progs, nil
}

// progPin is the pin name of a program of overlay ovl (overlay 0's keep their kernel names).
func progPin(name string, ovl int) string {
	if ovl == 0 {
		return name
	}
	return fmt.Sprintf("%s_o%d", name, ovl)
}

func pinObjects(o *fpObjects, dir string) error {
	if err := os.MkdirAll(filepath.Join(dir, linksSub), 0o700); err != nil {
		return fmt.Errorf("fastpath: create pin directory (is bpffs mounted on /sys/fs/bpf?): %w", err)
	}
	for name, m := range mapsOf(&o.fpMaps) {
		if err := (*m).Pin(filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("fastpath: pin %s: %w", name, err)
		}
	}
	return pinPrograms(&o.fpPrograms, dir, 0)
}

func pinPrograms(p *fpPrograms, dir string, ovl int) error {
	for name, p := range progsOf(p) {
		if err := p.Pin(filepath.Join(dir, progPin(name, ovl))); err != nil {
			return fmt.Errorf("fastpath: pin %s: %w", progPin(name, ovl), err)
		}
	}
	return nil
}

// pinned are an attachment's maps and programs re-opened from their pins: overlay 0's programs
// embedded, the other overlays' in more.
type pinned struct {
	fpMaps
	fpPrograms
	more map[int]*fpPrograms
}

func (p *pinned) Close() {
	p.fpMaps.Close()
	p.fpPrograms.Close()
	for _, m := range p.more {
		m.Close()
	}
}

// progs are the programs of overlay ovl (nil if not opened).
func (p *pinned) progs(ovl int) *fpPrograms {
	if ovl == 0 {
		return &p.fpPrograms
	}
	return p.more[ovl]
}

func (p *pinned) tables() endpoints.Tables {
	return endpoints.Tables{EP: p.PrgFastpathEp, Port: p.PrgFastpathPort}
}

// openPinned opens the maps and the programs of the overlays ovls.
func openPinned(target string, ovls ...int) (*pinned, error) {
	return openPins(target, false, ovls...)
}

// openPinnedToRead opens the maps for reading them (status, /metrics): the maps of laterMaps that
// an attachment of an older binary lacks until the node agent upgrades it are left nil (read as
// empty: view.go's counters), where openPinned fails, so the new binary's status can show such an
// attachment in the meantime (a binary installed before the agent's restart, or no agent at all).
func openPinnedToRead(target string) (*pinned, error) { return openPins(target, true) }

func openPins(target string, olderOK bool, ovls ...int) (*pinned, error) {
	dir := datapath.ModePinDir(target, Name)
	p := &pinned{more: map[int]*fpPrograms{}}
	for name, m := range mapsOf(&p.fpMaps) {
		var err error
		if *m, err = ebpf.LoadPinnedMap(filepath.Join(dir, name), nil); err != nil {
			if olderOK && errors.Is(err, os.ErrNotExist) && slices.Contains(laterMaps, name) {
				*m = nil
				continue
			}
			p.Close()
			return nil, fmt.Errorf("fastpath: open pinned %s (is fastpath attached to %s?): %w", name, netnsutil.Label(target), err)
		}
	}
	for _, ovl := range ovls {
		fp := &p.fpPrograms
		if ovl != 0 {
			fp = &fpPrograms{}
			p.more[ovl] = fp
		}
		for name, dst := range map[string]**ebpf.Program{"prg_fastpath_tx": &fp.PrgFastpathTx, "prg_fastpath_rx": &fp.PrgFastpathRx,
			"prg_fastpath_lrn_tx": &fp.PrgFastpathLrnTx, "prg_fastpath_lrn_rx": &fp.PrgFastpathLrnRx, "prg_fastpath_dtx": &fp.PrgFastpathDtx,
			"prg_fastpath_drx": &fp.PrgFastpathDrx, "prg_fastpath_dlrn_tx": &fp.PrgFastpathDlrnTx} {
			var err error
			if *dst, err = ebpf.LoadPinnedProgram(filepath.Join(dir, progPin(name, ovl)), nil); err != nil {
				p.Close()
				return nil, fmt.Errorf("fastpath: open pinned %s: %w", progPin(name, ovl), err)
			}
		}
	}
	return p, nil
}

func fmtInt(i int64) string { return fmt.Sprint(i) }
