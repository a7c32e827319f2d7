package probe

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// Interrupts is one read of /proc/interrupts: for each row the count per CPU. Rows are the
// numbered device IRQs ("24", "41": a NIC queue, a disk) and the architecture's own lines
// (x86: LOC local timer, RES rescheduling IPIs, CAL function-call IPIs, TLB shootdowns, IWI,
// NMI, ...; arm64: IPI0..IPIn). Lines that carry one machine-wide value (x86 ERR, MIS) are left
// out: they have no CPU.
type Interrupts struct {
	CPUs []int               // column CPU ids from the header, in file order
	Rows map[string][]uint64 // row label -> count per CPU, aligned with CPUs
	Desc map[string]string   // row label -> the text after the counts ("virtio3-rx", "Function call interrupts")
}

// Interrupt kinds a delta is grouped into (InterruptDelta.ByKind).
const (
	IRQKindDevice = "device" // numbered rows: hardware (or virtual hardware) device interrupts
	IRQKindLOC    = "loc"    // local timer
	IRQKindRES    = "res"    // rescheduling IPIs (a wakeup on another CPU)
	IRQKindCAL    = "cal"    // function-call IPIs (RPS kicks a remote CPU's backlog with one)
	IRQKindTLB    = "tlb"    // TLB shootdown IPIs
	IRQKindOther  = "other"  // every other architecture line (IWI, NMI, PMI, ...)
)

// IRQKinds lists the kinds in the order reports show them.
var IRQKinds = []string{IRQKindDevice, IRQKindCAL, IRQKindRES, IRQKindTLB, IRQKindLOC, IRQKindOther}

// ReadInterrupts reads /proc/interrupts.
func ReadInterrupts() (Interrupts, error) { return readProcFile("/proc/interrupts", ParseInterrupts) }

// ParseInterrupts parses /proc/interrupts text: a header of "CPUn" labels, then rows
// "LABEL: c0 c1 ... [chip hwirq name | description]". A row with fewer counts than CPUs (ERR,
// MIS) is skipped; a row whose first field after the label is not a number is an error.
func ParseInterrupts(r io.Reader) (Interrupts, error) {
	in := Interrupts{Rows: map[string][]uint64{}, Desc: map[string]string{}}
	cpus, err := scanCPUTable(r, "/proc/interrupts", func(n int, label string, f []string) error {
		v := make([]uint64, 0, n)
		for _, s := range f {
			if len(v) == n {
				break
			}
			x, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				break
			}
			v = append(v, x)
		}
		if len(v) == 0 {
			return fmt.Errorf("/proc/interrupts: row %s has no counts", label)
		}
		if len(v) < n {
			return nil // a machine-wide line (ERR, MIS): no per-CPU split
		}
		in.Rows[label] = v
		in.Desc[label] = strings.Join(f[n:], " ")
		return nil
	})
	if err != nil {
		return Interrupts{}, err
	}
	in.CPUs = cpus
	return in, nil
}

// IRQKind says which kind a row is: device for numbered rows, else by the architecture label
// (x86) or description (arm64's IPIn rows).
func IRQKind(label, desc string) string {
	if _, err := strconv.Atoi(label); err == nil {
		return IRQKindDevice
	}
	switch label {
	case "LOC":
		return IRQKindLOC
	case "RES":
		return IRQKindRES
	case "CAL":
		return IRQKindCAL
	case "TLB":
		return IRQKindTLB
	}
	d := strings.ToLower(desc)
	switch {
	case strings.HasPrefix(d, "rescheduling"):
		return IRQKindRES
	case strings.Contains(d, "function call"):
		return IRQKindCAL
	case strings.HasPrefix(d, "timer") || strings.Contains(d, "local timer"):
		return IRQKindLOC
	case strings.Contains(d, "tlb"):
		return IRQKindTLB
	}
	return IRQKindOther
}

// InterruptDelta is what was raised during an interval.
type InterruptDelta struct {
	CPUs []int `json:"cpus"`
	// ByKind is the count per CPU of each kind (IRQKinds), aligned with CPUs.
	ByKind map[string][]uint64 `json:"by_kind"`
	// Total is every interrupt of every row on every CPU.
	Total uint64 `json:"total"`
	// Devices are the device rows that fired, by "label name" ("41 virtio3-rx"), all CPUs.
	Devices map[string]uint64 `json:"devices,omitempty"`
}

// InterruptDeltas computes the interval between two snapshots. The kernel's per-CPU counts are
// `unsigned int`; one wrap per interval is undone (see delta32). A different CPU set returns
// ErrCPUSetChanged; a row in only one snapshot (an IRQ requested or freed in between) is left out.
func InterruptDeltas(prev, cur Interrupts) (InterruptDelta, error) {
	if !sameCPUs(prev.CPUs, cur.CPUs) {
		return InterruptDelta{}, cpuSetError(prev.CPUs, cur.CPUs)
	}
	d := InterruptDelta{CPUs: slices.Clone(cur.CPUs), ByKind: map[string][]uint64{}}
	for _, k := range IRQKinds {
		d.ByKind[k] = make([]uint64, len(cur.CPUs))
	}
	for label, c := range cur.Rows {
		p, ok := prev.Rows[label]
		if !ok || len(p) != len(c) {
			continue
		}
		kind := IRQKind(label, cur.Desc[label])
		var row uint64
		for i := range c {
			n, err := delta32(p[i], c[i])
			if err != nil {
				return InterruptDelta{}, fmt.Errorf("interrupt %s cpu%d: %w", label, cur.CPUs[i], err)
			}
			d.ByKind[kind][i] += n
			row += n
		}
		d.Total += row
		if kind == IRQKindDevice && row > 0 {
			if d.Devices == nil {
				d.Devices = map[string]uint64{}
			}
			d.Devices[strings.TrimSpace(label+" "+lastField(cur.Desc[label]))] = row
		}
	}
	return d, nil
}

// Kind is the total of one kind over all CPUs.
func (d InterruptDelta) Kind(kind string) uint64 {
	var t uint64
	for _, n := range d.ByKind[kind] {
		t += n
	}
	return t
}

func lastField(s string) string {
	f := strings.Fields(s)
	if len(f) == 0 {
		return ""
	}
	return f[len(f)-1]
}
