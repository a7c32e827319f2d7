package probe

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
)

// LoadMonitor keeps an exponentially weighted moving average of each CPU's busy share, sampled
// from /proc/stat. It is FALCON's load signal: a controller reads Current() to write a per-CPU
// load map for the steering program, and gates load balancing on Average() < threshold.
//
// Each sample is the busy share over the last period; the average follows
// ewma = alpha*sample + (1-alpha)*ewma, starting at the first sample. A larger alpha reacts faster
// and is noisier; with period p the average forgets with a time constant of about p/alpha.
type LoadMonitor struct {
	period time.Duration
	alpha  float64
	signal LoadSignal

	mu   sync.Mutex
	prev *CPUStat
	ewma map[int]float64
	err  error

	stop chan struct{}
	done chan struct{}
}

// NewLoadMonitor returns a monitor that samples every period with the given alpha in (0, 1].
func NewLoadMonitor(period time.Duration, alpha float64) (*LoadMonitor, error) {
	if period <= 0 {
		return nil, fmt.Errorf("load monitor: period %v must be positive", period)
	}
	if !(alpha > 0 && alpha <= 1) {
		return nil, fmt.Errorf("load monitor: alpha %v must be in (0, 1]", alpha)
	}
	return &LoadMonitor{period: period, alpha: alpha, signal: LoadBusy, ewma: map[int]float64{}}, nil
}

// LoadSignal is what a LoadMonitor counts as a CPU's load.
type LoadSignal string

const (
	// LoadBusy is every non-idle share (1 - idle - iowait): FALCON's prototype.
	LoadBusy LoadSignal = "busy"
	// LoadKernel is the share a network softirq cannot run ahead of: system, IRQ, softirq and
	// steal time. User and nice time are left out because a NET_RX softirq raised on the CPU
	// (an RPS IPI, the NIC's interrupt) runs when that interrupt returns, before the task gets
	// the CPU back: a CPU busy with application code still has room for packet stages, and a
	// balancer that steers away from it wastes the room (measured: under a spinning thread on
	// one of two CPUs, the busy signal made two-choice FALCON slower than static hashing).
	LoadKernel LoadSignal = "kernel"
)

// ParseLoadSignal reads "busy" or "kernel".
func ParseLoadSignal(s string) (LoadSignal, error) {
	switch LoadSignal(s) {
	case LoadBusy, LoadKernel:
		return LoadSignal(s), nil
	}
	return "", fmt.Errorf("load signal %q: want busy (all non-idle time, FALCON's prototype) or kernel (system+irq+softirq+steal: what a softirq cannot preempt)", s)
}

// Of is the signal's load for one CPU's shares.
func (s LoadSignal) Of(sh Shares) float64 {
	if s == LoadKernel {
		return sh.System + sh.IRQ + sh.SoftIRQ + sh.Steal
	}
	return sh.Busy
}

// SetSignal picks what counts as load (LoadBusy unless set); call it before Start or Observe.
func (m *LoadMonitor) SetSignal(s LoadSignal) error {
	if _, err := ParseLoadSignal(string(s)); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.signal = s
	return nil
}

// Start reads the baseline and samples /proc/stat every period until Stop.
func (m *LoadMonitor) Start() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stop != nil {
		return errors.New("load monitor: already started")
	}
	s, err := ReadCPUStat()
	if err != nil {
		return err
	}
	m.prev = &s
	m.stop, m.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(m.done)
		t := time.NewTicker(m.period)
		defer t.Stop()
		for {
			select {
			case <-m.stop:
				return
			case <-t.C:
				s, err := ReadCPUStat()
				if err == nil {
					err = m.Observe(s)
				}
				// An empty interval is not a failure: the next sample covers it.
				if err != nil && !errors.Is(err, ErrEmptyInterval) {
					m.mu.Lock()
					m.err = err
					m.mu.Unlock()
				}
			}
		}
	}()
	return nil
}

// Stop ends sampling. The averages stay readable.
func (m *LoadMonitor) Stop() {
	m.mu.Lock()
	stop, done := m.stop, m.done
	m.mu.Unlock()
	if stop == nil {
		return
	}
	select {
	case <-stop:
	default:
		close(stop)
	}
	<-done
}

// Observe feeds one /proc/stat snapshot (the goroutine does this; tests and callers that already
// read /proc/stat may too). The first call only sets the baseline. If the CPU set changed, the
// snapshot becomes the new baseline, CPUs that left are forgotten, and ErrCPUSetChanged is
// returned; an interval shorter than a jiffy is skipped with ErrEmptyInterval (the next sample
// then covers the longer interval).
func (m *LoadMonitor) Observe(s CPUStat) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.prev == nil {
		m.prev = &s
		return nil
	}
	sh, err := CPUDelta(*m.prev, s)
	if errors.Is(err, ErrEmptyInterval) {
		return err
	}
	m.prev = &s
	if err != nil {
		keep := map[int]float64{}
		for _, id := range s.CPUs() {
			if v, ok := m.ewma[id]; ok {
				keep[id] = v
			}
		}
		m.ewma = keep
		return err
	}
	for _, c := range sh.PerCPU {
		v := m.signal.Of(c.Shares)
		if old, ok := m.ewma[c.CPU]; ok {
			m.ewma[c.CPU] = m.alpha*v + (1-m.alpha)*old
		} else {
			m.ewma[c.CPU] = v
		}
	}
	m.err = nil
	return nil
}

// Current returns the average busy share of each CPU, indexed by CPU id (length: highest id + 1).
// CPUs without data (offline, or no sample yet) read 1, fully loaded, so that a least-loaded
// choice never picks a CPU we know nothing about. Before the first full sample it returns nil.
func (m *LoadMonitor) Current() []float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.ewma) == 0 {
		return nil
	}
	hi := -1
	for id := range m.ewma {
		hi = max(hi, id)
	}
	out := make([]float64, hi+1)
	for i := range out {
		out[i] = 1
	}
	for id, v := range m.ewma {
		out[id] = v
	}
	return out
}

// Average returns the mean averaged busy share over the given CPU ids (nil: all CPUs with data).
// CPUs without data are skipped; if none has data it returns NaN, which fails every "< threshold"
// comparison, so a gate stays closed until the monitor knows something.
func (m *LoadMonitor) Average(cpus []int) float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	sum, n := 0.0, 0
	if cpus == nil {
		for _, v := range m.ewma {
			sum += v
			n++
		}
	} else {
		for _, id := range cpus {
			if v, ok := m.ewma[id]; ok {
				sum += v
				n++
			}
		}
	}
	if n == 0 {
		return math.NaN()
	}
	return sum / float64(n)
}

// Err returns the error of the last failed periodic sample, nil once a sample succeeds again.
func (m *LoadMonitor) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err
}
