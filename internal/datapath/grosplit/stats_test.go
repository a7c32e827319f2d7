package grosplit

import (
	"maps"
	"reflect"
	"testing"
)

// Sum adds every counter and every per-CPU count across the CPUs, and leaves the Last* fields
// (which name one frame on one CPU) zero.
func TestStatsSum(t *testing.T) {
	s := Stats{PerCPU: []CPUStats{
		{CPU: 0, Redirected: 3, Passed: 2, Missed: 1, Dropped: 1, VXLAN: 2, ToCPU: map[int]uint64{2: 2, 3: 1},
			Mice: 4, Batches: 2, BatchToCPU: map[int]uint64{2: 2}, Diverted: 1, LastHash: 9, LastSlot: 1, LastCPU: 3},
		{CPU: 1, Redirected: 5, Passed: 1, VXLAN: 5, ToCPU: map[int]uint64{3: 5},
			Mice: 1, Batches: 1, BatchToCPU: map[int]uint64{3: 1}, Overflow: 2, LastCPU: 3},
	}}
	got := s.Sum()
	want := CPUStats{CPU: -1, Redirected: 8, Passed: 3, Missed: 1, Dropped: 1, VXLAN: 7, Mice: 5, Batches: 3, Diverted: 1, Overflow: 2}
	if !maps.Equal(got.ToCPU, map[int]uint64{2: 2, 3: 6}) || !maps.Equal(got.BatchToCPU, map[int]uint64{2: 2, 3: 1}) {
		t.Errorf("per-CPU sums: ToCPU %v, BatchToCPU %v", got.ToCPU, got.BatchToCPU)
	}
	got.ToCPU, got.BatchToCPU = nil, nil
	if !reflect.DeepEqual(got, want) {
		t.Errorf("sum %+v\nwant %+v", got, want)
	}
	if s.PerCPU[0].ToCPU[3] != 1 {
		t.Errorf("Sum changed a CPU's own counts: %v", s.PerCPU[0].ToCPU)
	}
}
