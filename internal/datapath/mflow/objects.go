package mflow

import (
	"fmt"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/datapath/bpfobj"
)

// Pin layout under datapath.ModePinDir: the skb-level maps by their kernel names, one tcx link
// per device in links/, and the XDP split of each underlay in xdp-<device>/.
const (
	mapStats = "prg_mf_stats"
	mapFlows = "prg_mf_flows"
)

func splitDir(target, dev string) string {
	return filepath.Join(datapath.ModePinDir(target, Name), "xdp-"+bpfobj.Sanitize(dev))
}

// loadObjects loads prg_mflow_dev/port and their maps. flows, if not nil, is the flow map to use
// instead of a new one (the XDP split's, so the merge program sees its elephants).
func loadObjects(flows *ebpf.Map) (*mfObjects, error) {
	opts := &ebpf.CollectionOptions{}
	if flows != nil {
		opts.MapReplacements = map[string]*ebpf.Map{mapFlows: flows}
	}
	return bpfobj.New[mfObjects](Name, loadMf, opts)
}

// writeConfig fills prg_mf_cfg.
func writeConfig(m *ebpf.Map, c Config, ports []uint16) error {
	if len(ports) > len(mfMfCfg{}.VxlanPorts) {
		return fmt.Errorf("mflow: %d VXLAN ports, at most %d", len(ports), len(mfMfCfg{}.VxlanPorts))
	}
	v := mfMfCfg{N_cpus: uint32(len(c.CPUs))}
	copy(v.VxlanPorts[:], ports)
	cpus := slices.Sorted(slices.Values(c.CPUs)) // the RPS map's order
	for i, cpu := range cpus {
		v.Cpus[i] = uint32(cpu)
	}
	if c.Merge {
		v.Merge = 1
	}
	if c.MiceAffine {
		v.MiceAffine = 1
	}
	v.Mf.Batch = uint32(c.Batch)
	v.Mf.ElephPps = c.ElephantPPS
	v.Mf.ElephBps = c.ElephantBPS
	v.Mf.WindowNs = uint64(c.Window.Nanoseconds())
	v.GuardOoo = uint32(c.Guard)
	v.GuardHoldNs = uint64(c.GuardHold.Nanoseconds())
	if err := m.Put(uint32(0), v); err != nil {
		return fmt.Errorf("mflow: write config: %w", err)
	}
	return nil
}
