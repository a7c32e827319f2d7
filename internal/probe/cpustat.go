package probe

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// CPUTimes are the jiffies one CPU has spent in each state since boot, as /proc/stat reports them.
// guest and guest_nice are left out on purpose: the kernel already counts them inside user and
// nice, so adding them would count guest time twice.
type CPUTimes struct {
	CPU     int // CPU id; -1 for the aggregate "cpu" line
	User    uint64
	Nice    uint64
	System  uint64
	Idle    uint64
	IOWait  uint64
	IRQ     uint64
	SoftIRQ uint64
	Steal   uint64
}

// Total is the sum of all states: the time this CPU existed.
func (t CPUTimes) Total() uint64 {
	return t.User + t.Nice + t.System + t.Idle + t.IOWait + t.IRQ + t.SoftIRQ + t.Steal
}

// CPUStat is one read of /proc/stat. PerCPU is sorted by CPU id and holds the online CPUs only
// (the kernel prints online CPUs), so a CPU going offline changes the set.
type CPUStat struct {
	All    CPUTimes
	PerCPU []CPUTimes
}

// CPUs returns the CPU ids of the snapshot in order.
func (s CPUStat) CPUs() []int { return cpuIDs(s.PerCPU, CPUTimes.cpu) }

func (t CPUTimes) cpu() int { return t.CPU }

// ReadCPUStat reads /proc/stat.
func ReadCPUStat() (CPUStat, error) { return readProcFile("/proc/stat", ParseCPUStat) }

// ParseCPUStat parses the cpu lines of /proc/stat text and ignores the rest (intr, ctxt, ...).
func ParseCPUStat(r io.Reader) (CPUStat, error) {
	var s CPUStat
	seenAll := false
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1<<20) // the intr line is long on machines with many IRQs
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || !strings.HasPrefix(f[0], "cpu") {
			continue
		}
		t, err := parseCPULine(f)
		if err != nil {
			return CPUStat{}, err
		}
		if t.CPU < 0 {
			s.All, seenAll = t, true
		} else {
			s.PerCPU = append(s.PerCPU, t)
		}
	}
	if err := sc.Err(); err != nil {
		return CPUStat{}, err
	}
	if !seenAll || len(s.PerCPU) == 0 {
		return CPUStat{}, fmt.Errorf("/proc/stat: no cpu lines")
	}
	if err := sortByCPU(s.PerCPU, CPUTimes.cpu, "/proc/stat"); err != nil {
		return CPUStat{}, err
	}
	return s, nil
}

func parseCPULine(f []string) (CPUTimes, error) {
	t := CPUTimes{CPU: -1}
	if f[0] != "cpu" {
		id, err := strconv.Atoi(strings.TrimPrefix(f[0], "cpu"))
		if err != nil || id < 0 {
			return t, fmt.Errorf("/proc/stat: bad cpu label %q", f[0])
		}
		t.CPU = id
	}
	// user nice system idle have always been there; later kernels appended the rest, so columns
	// missing on an old kernel stay zero.
	if len(f) < 5 {
		return t, fmt.Errorf("/proc/stat: %s: %d fields, want at least 4", f[0], len(f)-1)
	}
	dst := []*uint64{&t.User, &t.Nice, &t.System, &t.Idle, &t.IOWait, &t.IRQ, &t.SoftIRQ, &t.Steal}
	for i, p := range dst {
		if i+1 >= len(f) {
			break
		}
		v, err := strconv.ParseUint(f[i+1], 10, 64)
		if err != nil {
			return t, fmt.Errorf("/proc/stat: %s field %d: %w", f[0], i+1, err)
		}
		*p = v
	}
	return t, nil
}

// Shares are fractions of an interval spent in each state; the eight states sum to 1.
// Busy is 1 - Idle - IOWait (iowait is idle time with I/O pending, not work).
type Shares struct {
	User    float64 `json:"user"`
	Nice    float64 `json:"nice"`
	System  float64 `json:"system"`
	IRQ     float64 `json:"irq"`
	SoftIRQ float64 `json:"softirq"`
	Idle    float64 `json:"idle"`
	IOWait  float64 `json:"iowait"`
	Steal   float64 `json:"steal"`
	Busy    float64 `json:"busy"`
}

// CPUShare is the shares of one CPU over an interval.
type CPUShare struct {
	CPU     int    `json:"cpu"`
	Jiffies uint64 `json:"jiffies"` // accounted time in the interval (USER_HZ ticks)
	Shares
}

// CPUShares is what /proc/stat says about an interval.
type CPUShares struct {
	PerCPU []CPUShare `json:"per_cpu"`
	// All is the mean of the per-CPU shares: each CPU counts as 1/N of the machine. We do not
	// weight by jiffies (or use the aggregate "cpu" line) because per-CPU totals over the same
	// wall interval differ by a few ticks from tickless idle accounting, which would make the
	// machine-wide figure depend on accounting noise.
	All Shares `json:"all"`
	// BusyCPUs is the sum of per-CPU busy shares: how many CPUs' worth of work was done.
	BusyCPUs float64 `json:"busy_cpus"`
}

// CPUDelta computes the shares of each CPU between two snapshots.
//
// Behaviour on odd input: a different CPU set returns ErrCPUSetChanged; a CPU with no accounted
// time returns ErrEmptyInterval. A single state going backwards is clamped to zero instead of
// failing, because iowait (and on some kernels idle) is documented to step back slightly on
// tickless kernels (proc(5)); the remaining states are still right.
func CPUDelta(prev, cur CPUStat) (CPUShares, error) {
	if !sameCPUs(prev.CPUs(), cur.CPUs()) {
		return CPUShares{}, cpuSetError(prev.CPUs(), cur.CPUs())
	}
	out := CPUShares{PerCPU: make([]CPUShare, len(cur.PerCPU))}
	for i := range cur.PerCPU {
		sh, jif, err := shares(prev.PerCPU[i], cur.PerCPU[i])
		if err != nil {
			return CPUShares{}, err
		}
		out.PerCPU[i] = CPUShare{CPU: cur.PerCPU[i].CPU, Jiffies: jif, Shares: sh}
		out.All.add(sh)
		out.BusyCPUs += sh.Busy
	}
	out.All.scale(1 / float64(len(cur.PerCPU)))
	return out, nil
}

func clampSub(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}

func shares(p, c CPUTimes) (Shares, uint64, error) {
	d := CPUTimes{
		User: clampSub(c.User, p.User), Nice: clampSub(c.Nice, p.Nice),
		System: clampSub(c.System, p.System), Idle: clampSub(c.Idle, p.Idle),
		IOWait: clampSub(c.IOWait, p.IOWait), IRQ: clampSub(c.IRQ, p.IRQ),
		SoftIRQ: clampSub(c.SoftIRQ, p.SoftIRQ), Steal: clampSub(c.Steal, p.Steal),
	}
	tot := d.Total()
	if tot == 0 {
		return Shares{}, 0, fmt.Errorf("%w: cpu%d accounted no time", ErrEmptyInterval, c.CPU)
	}
	f := 1 / float64(tot)
	s := Shares{
		User: float64(d.User) * f, Nice: float64(d.Nice) * f, System: float64(d.System) * f,
		IRQ: float64(d.IRQ) * f, SoftIRQ: float64(d.SoftIRQ) * f, Idle: float64(d.Idle) * f,
		IOWait: float64(d.IOWait) * f, Steal: float64(d.Steal) * f,
	}
	s.Busy = float64(tot-d.Idle-d.IOWait) * f
	return s, tot, nil
}

func (s *Shares) add(o Shares) {
	s.User += o.User
	s.Nice += o.Nice
	s.System += o.System
	s.IRQ += o.IRQ
	s.SoftIRQ += o.SoftIRQ
	s.Idle += o.Idle
	s.IOWait += o.IOWait
	s.Steal += o.Steal
	s.Busy += o.Busy
}

func (s *Shares) scale(k float64) {
	s.User *= k
	s.Nice *= k
	s.System *= k
	s.IRQ *= k
	s.SoftIRQ *= k
	s.Idle *= k
	s.IOWait *= k
	s.Steal *= k
	s.Busy *= k
}
