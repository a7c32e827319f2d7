package probe

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Softirqs is one read of /proc/softirqs: for each softirq (NET_RX, NET_TX, TIMER, ...) the number
// of times it ran on each CPU. The kernel prints every *possible* CPU, so the set rarely changes.
type Softirqs struct {
	CPUs   []int               // column CPU ids from the header, in file order
	Counts map[string][]uint64 // row name -> count per CPU, aligned with CPUs
}

// ReadSoftirqs reads /proc/softirqs.
func ReadSoftirqs() (Softirqs, error) {
	b, err := os.ReadFile("/proc/softirqs")
	if err != nil {
		return Softirqs{}, err
	}
	return ParseSoftirqs(bytes.NewReader(b))
}

// ParseSoftirqs parses /proc/softirqs text: a header of "CPUn" labels, then "NAME: c0 c1 ..." rows.
func ParseSoftirqs(r io.Reader) (Softirqs, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	if !sc.Scan() {
		if err := sc.Err(); err != nil {
			return Softirqs{}, err
		}
		return Softirqs{}, fmt.Errorf("/proc/softirqs: empty")
	}
	s := Softirqs{Counts: map[string][]uint64{}}
	for _, h := range strings.Fields(sc.Text()) {
		id, err := strconv.Atoi(strings.TrimPrefix(h, "CPU"))
		if !strings.HasPrefix(h, "CPU") || err != nil {
			return Softirqs{}, fmt.Errorf("/proc/softirqs: bad header label %q", h)
		}
		s.CPUs = append(s.CPUs, id)
	}
	if len(s.CPUs) == 0 {
		return Softirqs{}, fmt.Errorf("/proc/softirqs: no CPU columns")
	}
	if !slices.IsSorted(s.CPUs) {
		return Softirqs{}, fmt.Errorf("/proc/softirqs: CPU columns out of order: %v", s.CPUs)
	}
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		name, ok := strings.CutSuffix(f[0], ":")
		if !ok {
			return Softirqs{}, fmt.Errorf("/proc/softirqs: bad row %q", sc.Text())
		}
		if len(f)-1 != len(s.CPUs) {
			return Softirqs{}, fmt.Errorf("/proc/softirqs: %s has %d values for %d CPUs", name, len(f)-1, len(s.CPUs))
		}
		v := make([]uint64, len(s.CPUs))
		for i := range v {
			n, err := strconv.ParseUint(f[i+1], 10, 64)
			if err != nil {
				return Softirqs{}, fmt.Errorf("/proc/softirqs: %s: %w", name, err)
			}
			v[i] = n
		}
		s.Counts[name] = v
	}
	if err := sc.Err(); err != nil {
		return Softirqs{}, err
	}
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
