package ezpath

import (
	"github.com/cilium/ebpf"

	"github.com/peregrine-net/peregrine/internal/datapath/bpfobj"
)

// DefaultTableSize is max_entries of ezp_encap and ezp_decap: the switch SRAM budget in entries.
const DefaultTableSize = 1024

const who = "ezpath"

// newTorObjects loads the switch data plane with tableSize entries in each tunnel table.
func newTorObjects(tableSize int) (*torObjects, error) {
	spec, err := loadTor()
	if err != nil {
		return nil, err
	}
	if tableSize <= 0 {
		tableSize = DefaultTableSize
	}
	for _, m := range []string{torMapEzpEncap, torMapEzpDecap} {
		spec.Maps[m].MaxEntries = uint32(tableSize)
	}
	var o torObjects
	if err := bpfobj.Load(who, spec, &o, nil); err != nil {
		return nil, err
	}
	return &o, nil
}

func newHostObjects() (*hostObjects, error) {
	spec, err := loadHost()
	if err != nil {
		return nil, err
	}
	var o hostObjects
	if err := bpfobj.Load(who, spec, &o, nil); err != nil {
		return nil, err
	}
	return &o, nil
}

// torTables and hostTables are a running switch's or host's maps, opened from their pins.
type (
	torTables  = torMaps
	hostTables = hostMaps
)

func openTorTables(dir string) (*torTables, error) {
	var t torTables
	if err := bpfobj.OpenPinned(who+" switch", dir, &t, false); err != nil {
		return nil, err
	}
	return &t, nil
}

func openHostTables(dir string) (*hostTables, error) {
	var t hostTables
	if err := bpfobj.OpenPinned(who+" host", dir, &t, false); err != nil {
		return nil, err
	}
	return &t, nil
}

// sumPerCPU reads n per-CPU counters of a PERCPU_ARRAY and sums each over the CPUs.
func sumPerCPU(m *ebpf.Map, n int) ([]uint64, error) {
	out := make([]uint64, n)
	for i := 0; i < n; i++ {
		var per []uint64
		if err := m.Lookup(uint32(i), &per); err != nil {
			return nil, err
		}
		for _, v := range per {
			out[i] += v
		}
	}
	return out, nil
}
