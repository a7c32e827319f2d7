package falcon

import (
	"testing"

	"github.com/peregrine-net/peregrine/internal/probe"
)

// cpuStat builds a /proc/stat snapshot in which CPU0 and CPU1 have spent the given cumulative
// jiffies in softirq, out of total.
func cpuStat(soft0, soft1, total uint64) probe.CPUStat {
	mk := func(cpu int, soft uint64) probe.CPUTimes {
		return probe.CPUTimes{CPU: cpu, SoftIRQ: soft, Idle: total - soft}
	}
	return probe.CPUStat{PerCPU: []probe.CPUTimes{mk(0, soft0), mk(1, soft1)}}
}

func TestAutoSplitHysteresis(t *testing.T) {
	var c splitController
	split := []int{1}
	var s0, s1, total uint64
	step := func(share0, share1 float64) int {
		total += 100
		s0 += uint64(share0 * 100)
		s1 += uint64(share1 * 100)
		return c.observe(cpuStat(s0, s1, total), split)
	}
	step(0, 0) // baseline
	// A saturated split CPU does not count: only cores outside the split set carry the NIC stage.
	for i := 0; i < 40; i++ {
		if d := step(0.1, 1.0); d != 0 {
			t.Fatalf("sample %d: split CPU saturation triggered %d", i, d)
		}
	}
	// CPU0 saturated: on after the EWMA crosses 85 % and stays there splitHotSamples times.
	on := -1
	for i := 0; i < 60; i++ {
		if d := step(1.0, 0); d == +1 {
			on = i
			break
		}
	}
	if on < splitHotSamples-1 {
		t.Fatalf("split turned on after %d saturated samples, want at least %d", on+1, splitHotSamples)
	}
	c.on = true
	// Hovering between the thresholds changes nothing.
	for i := 0; i < 100; i++ {
		if d := step(0.7, 0); d != 0 {
			t.Fatalf("mid-load sample %d changed the split (%d)", i, d)
		}
	}
	off := -1
	for i := 0; i < 200; i++ {
		if d := step(0.0, 0); d == -1 {
			off = i
			break
		}
	}
	if off < splitColdSamples-1 {
		t.Fatalf("split turned off after %d cool samples, want at least %d", off+1, splitColdSamples)
	}
}
