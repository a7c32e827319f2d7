package falcon

import (
	"errors"
	"slices"
	"time"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/probe"
)

// --split auto: the paper applies softirq splitting "only to a device that fully saturates a
// core". The agent watches each CPU's softirq+irq share (an EWMA over its samples) and attaches
// the GRO split while a CPU outside the split set stays saturated with it — the NIC stage's core —
// and detaches it once that CPU has cooled down. Hysteresis keeps it from flapping: on after
// splitHotSamples saturated samples in a row, off after splitColdSamples cool ones.
const (
	splitHotShare    = 0.85
	splitColdShare   = 0.50
	splitHotSamples  = 5  // 100 ms at the default 20 ms interval
	splitColdSamples = 50 // 1 s
	splitRetry       = 10 * time.Second
)

type splitController struct {
	prev     probe.CPUStat
	have     bool
	share    map[int]float64
	hot      int
	cold     int
	on       bool
	failedAt time.Time
}

// observe updates the softirq shares and says whether the split should change: +1 attach,
// -1 detach, 0 nothing.
func (c *splitController) observe(s probe.CPUStat, splitCPUs []int) int {
	if !c.have {
		c.prev, c.have = s, true
		return 0
	}
	d, err := probe.CPUDelta(c.prev, s)
	c.prev = s
	if err != nil {
		return 0
	}
	if c.share == nil {
		c.share = map[int]float64{}
	}
	maxShare := 0.0
	for _, p := range d.PerCPU {
		if p.Jiffies == 0 {
			continue
		}
		v := p.SoftIRQ + p.IRQ
		c.share[p.CPU] = ewmaAlpha*v + (1-ewmaAlpha)*c.share[p.CPU]
		if !slices.Contains(splitCPUs, p.CPU) && c.share[p.CPU] > maxShare {
			maxShare = c.share[p.CPU]
		}
	}
	switch {
	case maxShare >= splitHotShare:
		c.hot, c.cold = c.hot+1, 0
	case maxShare < splitColdShare:
		c.hot, c.cold = 0, c.cold+1
	default:
		c.hot, c.cold = 0, 0
	}
	switch {
	case !c.on && c.hot >= splitHotSamples && time.Since(c.failedAt) > splitRetry:
		return +1
	case c.on && c.cold >= splitColdSamples:
		return -1
	}
	return 0
}

// autoSplit runs the controller on a sample and attaches or detaches the split, recording its
// pins in the attachment record first-hand so detach (or lab down) always finds them.
func (a *agent) autoSplit(s probe.CPUStat) {
	switch a.split.observe(s, a.cfg.SplitCPUs) {
	case +1:
		var attachErr error
		err := datapath.UpdateState(a.target, Name, 2*time.Second, func(st *datapath.State) error {
			attachErr = splitAttach(st.Topology, a.cfg, st) // records what it attached, even on error
			return nil
		})
		if err = errors.Join(err, attachErr); err != nil {
			a.log.Printf("auto split: attach failed, retrying in %v: %v", splitRetry, err)
			a.split.failedAt = time.Now()
			_ = a.dropSplit() // undo a partial attach
			return
		}
		a.split.on, a.split.hot = true, 0
		a.log.Printf("auto split: NIC stage saturated (softirq share >= %.0f%%): GRO split on CPUs %v", splitHotShare*100, a.cfg.SplitCPUs)
	case -1:
		if err := a.dropSplit(); err != nil {
			a.log.Printf("auto split: detach: %v", err)
			return
		}
		a.split.on, a.split.cold = false, 0
		a.log.Printf("auto split: NIC stage cooled (< %.0f%%): GRO split off", splitColdShare*100)
	}
}

func (a *agent) dropSplit() error {
	return datapath.UpdateState(a.target, Name, 2*time.Second, func(st *datapath.State) error {
		err := splitDetach(st)
		ms, rerr := datapath.LoadModeState[modeState](st)
		if rerr != nil {
			return rerr
		}
		ms.SplitPins = nil
		datapath.SetModeState(st, ms)
		return err
	})
}
