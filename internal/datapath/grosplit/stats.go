package grosplit

import (
	"fmt"
	"path/filepath"

	"github.com/cilium/ebpf"
)

// CPUStats are the counters of one CPU that ran the XDP program (the IRQ core, or with veth the
// sender's CPU), or their sum.
type CPUStats struct {
	CPU        int    // -1 in a sum
	Redirected uint64 // frames handed to a split CPU
	Passed     uint64 // frames left on this CPU: not understood (non-IP, short...) or Missed
	Missed     uint64 // of Passed: the chosen split CPU had no cpumap entry (a live CPU-set change)
	Dropped    uint64 // frames the cpumap dropped at enqueue because a split CPU's ring was full
	VXLAN      uint64 // of Redirected: hashed on the inner 5-tuple
	// ToCPU counts Redirected by split CPU.
	ToCPU map[int]uint64
	// MFLOW (Config.MFlow): frames of flows below the elephant threshold, micro-flow batches
	// started, and those by split CPU.
	Mice       uint64
	Batches    uint64
	BatchToCPU map[int]uint64
	// The ring guard: frames sent to another split CPU because theirs was nearly full, and
	// frames passed (normal path) because every ring was.
	Diverted, Overflow uint64
	// The last redirected frame, for tests and debugging: its flow hash, slot in the CPU list
	// and split CPU.
	LastHash uint32
	LastSlot int
	LastCPU  int
}

// Stats are the counters of one split.
type Stats struct {
	PerCPU []CPUStats // indexed by CPU
}

// Sum adds up the CPUs (Last* fields are left zero: "last" has no meaning across CPUs).
func (s Stats) Sum() CPUStats {
	t := CPUStats{CPU: -1, ToCPU: map[int]uint64{}, BatchToCPU: map[int]uint64{}}
	for _, c := range s.PerCPU {
		t.Redirected += c.Redirected
		t.Passed += c.Passed
		t.Missed += c.Missed
		t.Dropped += c.Dropped
		t.VXLAN += c.VXLAN
		t.Mice += c.Mice
		t.Diverted += c.Diverted
		t.Overflow += c.Overflow
		t.Batches += c.Batches
		addByCPU(t.ToCPU, c.ToCPU)
		addByCPU(t.BatchToCPU, c.BatchToCPU)
	}
	return t
}

// addByCPU adds the per-CPU counts of from to sum.
func addByCPU(sum, from map[int]uint64) {
	for cpu, n := range from {
		sum[cpu] += n
	}
}

// ReadStats reads the counters of the split pinned under pinDir.
func ReadStats(pinDir string) (Stats, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, gsMapPrgGsStats), nil)
	if err != nil {
		return Stats{}, fmt.Errorf("grosplit: open stats of %s (is a split attached there?): %w", pinDir, err)
	}
	defer m.Close()
	return readStats(m)
}

func readStats(m *ebpf.Map) (Stats, error) {
	var per []gsGsStats
	if err := m.Lookup(uint32(0), &per); err != nil {
		return Stats{}, fmt.Errorf("grosplit: read stats: %w", err)
	}
	s := Stats{PerCPU: make([]CPUStats, len(per))}
	for cpu, v := range per {
		c := CPUStats{CPU: cpu, Redirected: v.Redirected, Passed: v.Passed, Missed: v.Missed,
			Dropped: v.Dropped, VXLAN: v.Vxlan, ToCPU: map[int]uint64{},
			LastHash: uint32(v.LastHash), LastSlot: int(v.LastSlot), LastCPU: int(v.LastCpu),
			Mice: v.Mice, Batches: v.Batches, BatchToCPU: map[int]uint64{}, Diverted: v.Diverted, Overflow: v.Overflow}
		for to, n := range v.ToCpu {
			if n > 0 {
				c.ToCPU[to] = n
			}
		}
		for to, n := range v.BatchToCpu {
			if n > 0 {
				c.BatchToCPU[to] = n
			}
		}
		s.PerCPU[cpu] = c
	}
	return s, nil
}
