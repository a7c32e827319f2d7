package probes

import (
	"github.com/peregrine-net/peregrine/internal/probe"
	"github.com/peregrine-net/peregrine/internal/results"
)

// fillInterrupts records a repetition's /proc/interrupts deltas: irqs_count (everything, all
// CPUs), irqs_<kind>_count and the per-CPU vectors per kind (Rep.Interrupts), and each device
// IRQ that fired as a counter ("interrupts.41 virtio3-rx"). On the lab's veth underlay no
// device IRQ belongs to the measured path: its receive work arrives by softirq, and RPS moves it
// between CPUs with function-call IPIs (cal), so cal and res are the lab's interrupt signal.
func fillInterrupts(rep *results.Rep, d *probe.InterruptDelta) {
	if d == nil {
		return
	}
	rep.SetInterrupts(d.ByKind)
	if rep.Counters == nil {
		rep.Counters = map[string]float64{}
	}
	for name, n := range d.Devices {
		rep.Counters["interrupts."+name] = float64(n)
	}
}
