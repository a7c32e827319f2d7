package falcon

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"

	"github.com/peregrine-net/peregrine/internal/datapath"
)

// Pin layout under datapath.PinDir(target)/falcon: the maps and programs by their kernel names
// (what bpftool shows), and one tcx link per device in links/. Removing the directory detaches
// everything once no process holds the objects open.
const (
	pinSub   = "falcon"
	linksSub = "links"
)

func pinDir(target string) string { return filepath.Join(datapath.PinDir(target), pinSub) }

// objects are the loaded (or re-opened pinned) maps and programs of one attachment.
type objects struct {
	Cfg, Gate, Load, Dev, Flow, Stat, Last *ebpf.Map
	Nic, Port                              *ebpf.Program
}

func (o *objects) maps() map[string]**ebpf.Map {
	return map[string]**ebpf.Map{
		"prg_falcon_cfg": &o.Cfg, "prg_falcon_gate": &o.Gate, "prg_falcon_load": &o.Load,
		"prg_falcon_dev": &o.Dev, "prg_falcon_flow": &o.Flow, "prg_falcon_stat": &o.Stat,
		"prg_falcon_last": &o.Last,
	}
}

func (o *objects) progs() map[string]**ebpf.Program {
	return map[string]**ebpf.Program{"prg_falcon_nic": &o.Nic, "prg_falcon_port": &o.Port}
}

// Close releases this process's references (pinned objects stay).
func (o *objects) Close() {
	for _, m := range o.maps() {
		if *m != nil {
			(*m).Close()
		}
	}
	for _, p := range o.progs() {
		if *p != nil {
			(*p).Close()
		}
	}
}

// loadObjects loads the programs and maps fresh (unpinned).
func loadObjects() (*objects, error) {
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("falcon: raise memlock limit: %w", err)
	}
	var fo falObjects
	if err := loadFalObjects(&fo, nil); err != nil {
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			return nil, fmt.Errorf("falcon: verifier rejected the programs: %+v", verr)
		}
		return nil, fmt.Errorf("falcon: load eBPF objects (needs Linux 6.6+ with BTF for tcx and kfuncs): %w", err)
	}
	return &objects{Cfg: fo.PrgFalconCfg, Gate: fo.PrgFalconGate, Load: fo.PrgFalconLoad, Dev: fo.PrgFalconDev,
		Flow: fo.PrgFalconFlow, Stat: fo.PrgFalconStat, Last: fo.PrgFalconLast,
		Nic: fo.PrgFalconNic, Port: fo.PrgFalconPort}, nil
}

// pin pins every map and program under dir.
func (o *objects) pin(dir string) error {
	if err := os.MkdirAll(filepath.Join(dir, linksSub), 0o700); err != nil {
		return fmt.Errorf("falcon: create pin directory (is bpffs mounted on /sys/fs/bpf?): %w", err)
	}
	for name, m := range o.maps() {
		if err := (*m).Pin(filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("falcon: pin %s: %w", name, err)
		}
	}
	for name, p := range o.progs() {
		if err := (*p).Pin(filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("falcon: pin %s: %w", name, err)
		}
	}
	return nil
}

// openPinned re-opens an attachment's pinned maps (and programs when progs is set).
func openPinned(target string, progs bool) (*objects, error) {
	dir := pinDir(target)
	o := &objects{}
	for name, m := range o.maps() {
		var err error
		if *m, err = ebpf.LoadPinnedMap(filepath.Join(dir, name), nil); err != nil {
			o.Close()
			return nil, fmt.Errorf("falcon: open pinned %s: %w", name, err)
		}
	}
	if progs {
		for name, p := range o.progs() {
			var err error
			if *p, err = ebpf.LoadPinnedProgram(filepath.Join(dir, name), nil); err != nil {
				o.Close()
				return nil, fmt.Errorf("falcon: open pinned %s: %w", name, err)
			}
		}
	}
	return o, nil
}

// writeConfig fills the static settings.
func (o *objects) writeConfig(c Config, vxlanPorts []uint16) error {
	v := falFalconCfg{N: uint32(len(c.CPUs)), Threshold: uint32(c.Threshold), RepickNs: uint64(c.Repick.Nanoseconds())}
	if c.TwoChoice {
		v.TwoChoice = 1
	}
	for i, cpu := range c.CPUs {
		v.Cpus[i] = uint32(cpu)
	}
	copy(v.VxlanPorts[:], vxlanPorts)
	if err := o.Cfg.Put(uint32(0), v); err != nil {
		return fmt.Errorf("falcon: write config: %w", err)
	}
	return nil
}

// Gate is the agent's view written for the programs.
type Gate struct {
	Open      bool
	Epoch     uint32
	AvgPct    uint32
	UpdatedNs uint64
}

func (o *objects) writeGate(g Gate) error {
	v := falFalconGate{Epoch: g.Epoch, Avg: g.AvgPct, UpdatedNs: g.UpdatedNs}
	if g.Open {
		v.Open = 1
	}
	return o.Gate.Put(uint32(0), v)
}

func (o *objects) readGate() (Gate, error) {
	var v falFalconGate
	if err := o.Gate.Lookup(uint32(0), &v); err != nil {
		return Gate{}, err
	}
	return Gate{Open: v.Open != 0, Epoch: v.Epoch, AvgPct: v.Avg, UpdatedNs: v.UpdatedNs}, nil
}

// setDev tells the programs what the device (netns inode, ifindex) they run on decides.
func (o *objects) setDev(inode uint64, ifindex int, salt uint32, stage uint32) error {
	k := falPrgDevKey{Netns: uint32(inode), Ifindex: uint32(ifindex)}
	return o.Dev.Put(k, falFalconDev{Salt: salt, Stage: stage})
}

func (o *objects) delDev(inode uint64, ifindex int) {
	_ = o.Dev.Delete(falPrgDevKey{Netns: uint32(inode), Ifindex: uint32(ifindex)})
}
