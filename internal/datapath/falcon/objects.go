package falcon

import (
	"fmt"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/bpfobj"
)

// Pin layout under datapath.ModePinDir: the maps and programs by their kernel names (what
// bpftool shows), and one tcx link per device in links/. Removing the directory detaches
// everything once no process holds the objects open.

// objects are bpf2go's objects of one attachment, loaded fresh or re-opened from the pins.
type objects = falObjects

// loadObjects loads the programs and maps fresh (unpinned).
func loadObjects() (*objects, error) { return bpfobj.New[objects](Name, loadFal, nil) }

// pin pins every map and program under dir.
func (o *objects) pin(dir string) error { return bpfobj.Pin(Name, dir, o) }

// openPinned re-opens an attachment's pinned maps (and programs when progs is set).
func openPinned(target string, progs bool) (*objects, error) {
	return bpfobj.Open[objects](Name, datapath.ModePinDir(target, Name), progs)
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
	if err := o.PrgFalconCfg.Put(uint32(0), v); err != nil {
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
	return o.PrgFalconGate.Put(uint32(0), v)
}

func (o *objects) readGate() (Gate, error) {
	var v falFalconGate
	if err := o.PrgFalconGate.Lookup(uint32(0), &v); err != nil {
		return Gate{}, err
	}
	return Gate{Open: v.Open != 0, Epoch: v.Epoch, AvgPct: v.Avg, UpdatedNs: v.UpdatedNs}, nil
}

// setDev tells the programs what the device (netns inode, ifindex) they run on decides.
func (o *objects) setDev(inode uint64, ifindex int, salt uint32, stage uint32) error {
	k := falPrgDevKey{Netns: uint32(inode), Ifindex: uint32(ifindex)}
	return o.PrgFalconDev.Put(k, falFalconDev{Salt: salt, Stage: stage})
}

func (o *objects) delDev(inode uint64, ifindex int) {
	_ = o.PrgFalconDev.Delete(falPrgDevKey{Netns: uint32(inode), Ifindex: uint32(ifindex)})
}
