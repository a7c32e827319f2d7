package probe

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// /proc/net/softnet_stat has one row per online CPU and hex columns. The layout grew over time:
//
//	col  0 processed         packets taken off this CPU's backlog/NAPI (u32 counter)
//	col  1 dropped           packets dropped because the backlog exceeded netdev_max_backlog
//	col  2 time_squeeze      net_rx_action ran out of budget or time with work left
//	cols 3-7                 always 0 (was fastroute)
//	col  8 cpu_collision     always 0 on modern kernels
//	col  9 received_rps      RPS IPIs this CPU received (10 columns, 2.6.35+)
//	col 10 flow_limit_count  (11 columns, 3.11+)
//	col 11 backlog_len       gauge: packets queued now           (13 columns, 5.10+)
//	col 12 cpu index         the CPU id of the row               (13 columns, 5.10+)
//	col 13 input_qlen        gauge: backlog input queue length   (15 columns, 6.x, seen on 6.18)
//	col 14 process_qlen      gauge: backlog process queue length (15 columns)
//
// So the CPU index is the last column on 13-column kernels but not on 15-column ones; we index
// by position, never "last". Without a CPU column, offline CPUs are skipped silently by the kernel,
// so row numbers are only CPU ids when all CPUs are online: we use the row number and say so
// (Softnet.CPUIndexed = false).
const (
	snMinColumns   = 10
	snFlowLimitCol = 10
	snBacklogCol   = 11
	snCPUCol       = 12
	snInputQCol    = 13
	snProcessQCol  = 14
)

// SoftnetCounters are the meaningful softnet_stat columns of one CPU (or a sum over CPUs).
// BacklogLen, InputQLen and ProcessQLen are gauges (a value at one instant), the rest counters.
// Columns a kernel does not print stay zero; Softnet.Columns tells which exist.
type SoftnetCounters struct {
	Processed      uint64 `json:"processed"`
	Dropped        uint64 `json:"dropped"`
	TimeSqueeze    uint64 `json:"time_squeeze"`
	ReceivedRPS    uint64 `json:"received_rps"`
	FlowLimitCount uint64 `json:"flow_limit_count"`
	BacklogLen     uint64 `json:"backlog_len"`
	InputQLen      uint64 `json:"input_qlen"`
	ProcessQLen    uint64 `json:"process_qlen"`
}

// SoftnetCPU is one row of softnet_stat.
type SoftnetCPU struct {
	CPU int `json:"cpu"`
	SoftnetCounters
}

// Softnet is one read of /proc/net/softnet_stat, sorted by CPU.
type Softnet struct {
	Columns    int  // columns per row in this kernel's layout
	CPUIndexed bool // CPU ids come from the kernel's cpu column (else they are row numbers)
	PerCPU     []SoftnetCPU
}

// CPUs returns the CPU ids of the snapshot in order.
func (s Softnet) CPUs() []int { return cpuIDs(s.PerCPU, SoftnetCPU.cpu) }

func (c SoftnetCPU) cpu() int { return c.CPU }

// ReadSoftnet reads /proc/net/softnet_stat. The file is not per network namespace (it is the
// per-CPU backlog of the whole machine), so the reading thread's namespace does not matter.
func ReadSoftnet() (Softnet, error) {
	return readProcFile("/proc/net/softnet_stat", ParseSoftnet)
}

// ParseSoftnet parses softnet_stat text of any layout with at least 10 columns.
func ParseSoftnet(r io.Reader) (Softnet, error) {
	var s Softnet
	sc := bufio.NewScanner(r)
	row := 0
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if s.Columns == 0 {
			if len(f) < snMinColumns {
				return Softnet{}, fmt.Errorf("softnet_stat: %d columns, want at least %d", len(f), snMinColumns)
			}
			s.Columns = len(f)
			s.CPUIndexed = len(f) > snCPUCol
		} else if len(f) != s.Columns {
			return Softnet{}, fmt.Errorf("softnet_stat: row %d has %d columns, row 0 has %d", row, len(f), s.Columns)
		}
		v := make([]uint64, len(f))
		for i, x := range f {
			n, err := strconv.ParseUint(x, 16, 64)
			if err != nil {
				return Softnet{}, fmt.Errorf("softnet_stat: row %d column %d: %w", row, i, err)
			}
			v[i] = n
		}
		c := SoftnetCPU{CPU: row}
		if s.CPUIndexed {
			c.CPU = int(v[snCPUCol])
		}
		c.Processed, c.Dropped, c.TimeSqueeze, c.ReceivedRPS = v[0], v[1], v[2], v[9]
		at := func(i int) uint64 {
			if i < len(v) {
				return v[i]
			}
			return 0
		}
		c.FlowLimitCount = at(snFlowLimitCol)
		c.BacklogLen = at(snBacklogCol)
		c.InputQLen = at(snInputQCol)
		c.ProcessQLen = at(snProcessQCol)
		s.PerCPU = append(s.PerCPU, c)
		row++
	}
	if err := sc.Err(); err != nil {
		return Softnet{}, err
	}
	if row == 0 {
		return Softnet{}, fmt.Errorf("softnet_stat: empty")
	}
	if err := sortByCPU(s.PerCPU, SoftnetCPU.cpu, "softnet_stat"); err != nil {
		return Softnet{}, err
	}
	return s, nil
}

// SoftnetDelta is what happened on each CPU's backlog during an interval. Counters are
// increases; the gauges (backlog_len, input_qlen, process_qlen) are the values at the end.
type SoftnetDelta struct {
	Columns    int             `json:"columns"`
	CPUIndexed bool            `json:"cpu_indexed"`
	PerCPU     []SoftnetCPU    `json:"per_cpu"`
	Total      SoftnetCounters `json:"total"`
}

// SoftnetDeltas computes per-CPU increases between two snapshots. The counters are 32-bit in
// the kernel and one wrap per interval is undone (see delta32). A different CPU set (hotplug) or a
// different layout returns an error.
func SoftnetDeltas(prev, cur Softnet) (SoftnetDelta, error) {
	if prev.Columns != cur.Columns {
		return SoftnetDelta{}, fmt.Errorf("softnet_stat: layout changed from %d to %d columns", prev.Columns, cur.Columns)
	}
	if !sameCPUs(prev.CPUs(), cur.CPUs()) {
		return SoftnetDelta{}, cpuSetError(prev.CPUs(), cur.CPUs())
	}
	d := SoftnetDelta{Columns: cur.Columns, CPUIndexed: cur.CPUIndexed, PerCPU: make([]SoftnetCPU, len(cur.PerCPU))}
	for i, c := range cur.PerCPU {
		p := prev.PerCPU[i]
		o := SoftnetCPU{CPU: c.CPU}
		for _, f := range []struct {
			dst       *uint64
			prev, cur uint64
			name      string
		}{
			{&o.Processed, p.Processed, c.Processed, "processed"},
			{&o.Dropped, p.Dropped, c.Dropped, "dropped"},
			{&o.TimeSqueeze, p.TimeSqueeze, c.TimeSqueeze, "time_squeeze"},
			{&o.ReceivedRPS, p.ReceivedRPS, c.ReceivedRPS, "received_rps"},
			{&o.FlowLimitCount, p.FlowLimitCount, c.FlowLimitCount, "flow_limit_count"},
		} {
			n, err := delta32(f.prev, f.cur)
			if err != nil {
				return SoftnetDelta{}, fmt.Errorf("softnet_stat cpu %d %s: %w", c.CPU, f.name, err)
			}
			*f.dst = n
		}
		o.BacklogLen, o.InputQLen, o.ProcessQLen = c.BacklogLen, c.InputQLen, c.ProcessQLen
		d.PerCPU[i] = o
		d.Total.add(o.SoftnetCounters)
	}
	return d, nil
}

func (t *SoftnetCounters) add(o SoftnetCounters) {
	t.Processed += o.Processed
	t.Dropped += o.Dropped
	t.TimeSqueeze += o.TimeSqueeze
	t.ReceivedRPS += o.ReceivedRPS
	t.FlowLimitCount += o.FlowLimitCount
	t.BacklogLen += o.BacklogLen
	t.InputQLen += o.InputQLen
	t.ProcessQLen += o.ProcessQLen
}
