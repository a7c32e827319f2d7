package probe

import (
	"fmt"
	"io"
	"slices"
	"strconv"
)

// Softirqs is one read of /proc/softirqs: for each softirq (NET_RX, NET_TX, TIMER, ...) the number
// of times it ran on each CPU. The kernel prints every *possible* CPU, so the set rarely changes.
type Softirqs struct {
	CPUs   []int               // column CPU ids from the header, in file order
	Counts map[string][]uint64 // row name -> count per CPU, aligned with CPUs
}

// ReadSoftirqs reads /proc/softirqs.
func ReadSoftirqs() (Softirqs, error) { return readProcFile("/proc/softirqs", ParseSoftirqs) }

// ParseSoftirqs parses /proc/softirqs text: a header of "CPUn" labels, then "NAME: c0 c1 ..." rows.
func ParseSoftirqs(r io.Reader) (Softirqs, error) {
	s := Softirqs{Counts: map[string][]uint64{}}
	cpus, err := scanCPUTable(r, "/proc/softirqs", func(n int, name string, f []string) error {
		if len(f) != n {
			return fmt.Errorf("/proc/softirqs: %s has %d values for %d CPUs", name, len(f), n)
		}
		v := make([]uint64, n)
		for i := range v {
			x, err := strconv.ParseUint(f[i], 10, 64)
			if err != nil {
				return fmt.Errorf("/proc/softirqs: %s: %w", name, err)
			}
			v[i] = x
		}
		s.Counts[name] = v
		return nil
	})
	if err != nil {
		return Softirqs{}, err
	}
	s.CPUs = cpus
	return s, nil
}

// SoftirqDelta is how many times each softirq ran on each CPU during an interval.
type SoftirqDelta struct {
	CPUs   []int               `json:"cpus"`
	Counts map[string][]uint64 `json:"counts"` // aligned with CPUs
	Total  map[string]uint64   `json:"total"`  // over all CPUs
}

// SoftirqDeltas computes per-CPU counts between two snapshots. The counters are 32-bit in the
// kernel and one wrap per interval is undone (see delta32). A different CPU set returns
// ErrCPUSetChanged; a row present in only one snapshot is left out.
func SoftirqDeltas(prev, cur Softirqs) (SoftirqDelta, error) {
	if !sameCPUs(prev.CPUs, cur.CPUs) {
		return SoftirqDelta{}, cpuSetError(prev.CPUs, cur.CPUs)
	}
	d := SoftirqDelta{CPUs: slices.Clone(cur.CPUs), Counts: map[string][]uint64{}, Total: map[string]uint64{}}
	for name, c := range cur.Counts {
		p, ok := prev.Counts[name]
		if !ok {
			continue
		}
		v := make([]uint64, len(c))
		for i := range c {
			n, err := delta32(p[i], c[i])
			if err != nil {
				return SoftirqDelta{}, fmt.Errorf("softirq %s cpu%d: %w", name, cur.CPUs[i], err)
			}
			v[i] = n
			d.Total[name] += n
		}
		d.Counts[name] = v
	}
	return d, nil
}

// Only returns the delta restricted to the named rows (e.g. "NET_RX", "NET_TX") for time series,
// where the other rows are noise.
func (d SoftirqDelta) Only(names ...string) SoftirqDelta {
	o := SoftirqDelta{CPUs: d.CPUs, Counts: map[string][]uint64{}, Total: map[string]uint64{}}
	for _, n := range names {
		if c, ok := d.Counts[n]; ok {
			o.Counts[n] = c
			o.Total[n] = d.Total[n]
		}
	}
	return o
}
