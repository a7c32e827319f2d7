package fastpath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

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
	var o fpObjects
	if err := loadFpObjects(&o, nil); err != nil {
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
		"prg_fastpath_stat": &m.PrgFastpathStat, "prg_fastpath_ep": &m.PrgFastpathEp, "prg_fastpath_port": &m.PrgFastpathPort}
}

func progsOf(p *fpPrograms) map[string]*ebpf.Program {
	return map[string]*ebpf.Program{"prg_fastpath_tx": p.PrgFastpathTx, "prg_fastpath_rx": p.PrgFastpathRx,
		"prg_fastpath_lrn_tx": p.PrgFastpathLrnTx, "prg_fastpath_lrn_rx": p.PrgFastpathLrnRx,
		"prg_fastpath_dtx": p.PrgFastpathDtx, "prg_fastpath_drx": p.PrgFastpathDrx, "prg_fastpath_dlrn_tx": p.PrgFastpathDlrnTx}
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
	for name, p := range progsOf(&o.fpPrograms) {
		if err := p.Pin(filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("fastpath: pin %s: %w", name, err)
		}
	}
	return nil
}

// pinned are an attachment's maps and programs re-opened from their pins.
type pinned struct {
	fpMaps
	fpPrograms
}

func (p *pinned) Close() { p.fpMaps.Close(); p.fpPrograms.Close() }

func (p *pinned) tables() endpoints.Tables {
	return endpoints.Tables{EP: p.PrgFastpathEp, Port: p.PrgFastpathPort}
}

func openPinned(target string, progs bool) (*pinned, error) {
	dir := datapath.ModePinDir(target, Name)
	p := &pinned{}
	for name, m := range mapsOf(&p.fpMaps) {
		var err error
		if *m, err = ebpf.LoadPinnedMap(filepath.Join(dir, name), nil); err != nil {
			p.Close()
			return nil, fmt.Errorf("fastpath: open pinned %s (is fastpath attached to %s?): %w", name, netnsutil.Label(target), err)
		}
	}
	if progs {
		for name, dst := range map[string]**ebpf.Program{"prg_fastpath_tx": &p.PrgFastpathTx, "prg_fastpath_rx": &p.PrgFastpathRx,
			"prg_fastpath_lrn_tx": &p.PrgFastpathLrnTx, "prg_fastpath_lrn_rx": &p.PrgFastpathLrnRx, "prg_fastpath_dtx": &p.PrgFastpathDtx,
			"prg_fastpath_drx": &p.PrgFastpathDrx, "prg_fastpath_dlrn_tx": &p.PrgFastpathDlrnTx} {
			var err error
			if *dst, err = ebpf.LoadPinnedProgram(filepath.Join(dir, name), nil); err != nil {
				p.Close()
				return nil, fmt.Errorf("fastpath: open pinned %s: %w", name, err)
			}
		}
	}
	return p, nil
}

func fmtInt(i int64) string { return fmt.Sprint(i) }
