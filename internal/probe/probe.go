// Package probe samples the system counters that explain a benchmark run: CPU time per state
// (/proc/stat), softirq counts (/proc/softirqs), the per-CPU receive backlog statistics
// (/proc/net/softnet_stat) and the SNMP/netstat counters of network namespaces.
//
// Every file has a parser that takes an io.Reader (so tests feed fixture text), a Read* function
// for the live file, and a delta function that turns two snapshots into what happened in between.
// Sampler ties them together for one run; LoadMonitor is the EWMA load signal for controllers.
package probe

import (
	"errors"
	"fmt"
	"math"
)

var (
	// ErrCPUSetChanged is returned when two snapshots do not cover the same CPUs (hotplug between
	// samples). Deltas across a hotplug are meaningless for the CPUs involved, so we refuse them.
	ErrCPUSetChanged = errors.New("probe: CPU set changed between snapshots")
	// ErrCounterReset is returned when a 64-bit counter went backwards (namespace recreated,
	// stats reset): there is no way to know how much happened in the interval.
	ErrCounterReset = errors.New("probe: counter went backwards")
	// ErrEmptyInterval is returned when no time was accounted between two /proc/stat snapshots
	// (they were taken within one jiffy), so shares cannot be computed.
	ErrEmptyInterval = errors.New("probe: empty interval")
)

// delta32 is the increase of a kernel counter that is an `unsigned int` (softirq counts, softnet
// stats): those wrap at 2^32, which a busy NET_RX counter reaches in hours. A decrease between two
// values that both fit in 32 bits is taken as exactly one wrap; sample at least every few seconds
// so two wraps cannot happen. A reset to zero is indistinguishable from a wrap for such counters.
// Values above 32 bits mean a kernel that made the counter wider; a decrease there is a reset.
func delta32(prev, cur uint64) (uint64, error) {
	if cur >= prev {
		return cur - prev, nil
	}
	if prev <= math.MaxUint32 && cur <= math.MaxUint32 {
		return cur + (1 << 32) - prev, nil
	}
	return 0, fmt.Errorf("%w: %d -> %d", ErrCounterReset, prev, cur)
}

// sameCPUs reports whether two CPU id lists are identical (both are sorted by their parsers).
func sameCPUs(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func cpuSetError(prev, cur []int) error {
	return fmt.Errorf("%w: %v -> %v", ErrCPUSetChanged, prev, cur)
}
