package probe

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"
)

// Snapshot is one read of every probe file.
type Snapshot struct {
	Time     time.Time
	CPU      CPUStat
	Softirqs Softirqs
	Softnet  Softnet
	// Interrupts is /proc/interrupts; Interrupts.Rows is nil where the file could not be read
	// (the interval then has no interrupt part, and says why in its errors).
	Interrupts Interrupts
	Nstat      map[string]Counters // by namespace name ("" = the caller's namespace)
}

// TakeSnapshot reads /proc/stat, /proc/softirqs, /proc/interrupts, /proc/net/softnet_stat and the nstat counters
// of each namespace. The machine-wide files are read first and back to back so that they
// describe nearly the same instant; namespace reads (a setns each) come after.
func TakeSnapshot(namespaces []string) (Snapshot, error) {
	s := Snapshot{Time: time.Now()}
	var err error
	if s.CPU, err = ReadCPUStat(); err != nil {
		return s, err
	}
	if s.Softirqs, err = ReadSoftirqs(); err != nil {
		return s, err
	}
	// Interrupts are optional: a kernel or container without a readable /proc/interrupts
	// must not cost the rest of the probes.
	s.Interrupts, _ = ReadInterrupts()
	if s.Softnet, err = ReadSoftnet(); err != nil {
		return s, err
	}
	s.Nstat = make(map[string]Counters, len(namespaces))
	for _, ns := range namespaces {
		c, err := ReadNstat(ns)
		if err != nil {
			return s, err
		}
		s.Nstat[ns] = c
	}
	return s, nil
}

// Interval is what happened between two snapshots. A part whose delta failed (see Report.Errors)
// is left out rather than failing the whole interval.
type Interval struct {
	StartS    float64       `json:"start_s"` // seconds since the sampler started
	DurationS float64       `json:"duration_s"`
	CPU       *CPUShares    `json:"cpu,omitempty"`
	Softirqs  *SoftirqDelta `json:"softirqs,omitempty"`
	Softnet   *SoftnetDelta `json:"softnet,omitempty"`
	// Interrupts are /proc/interrupts deltas: per kind and CPU, the total, the device rows.
	Interrupts *InterruptDelta             `json:"interrupts,omitempty"`
	Nstat      map[string]map[string]int64 `json:"nstat,omitempty"` // namespace -> counter -> delta
}

// Diff computes the interval between two snapshots. counters names, per namespace, the nstat
// counters to report (nil: all of them). origin is the time StartS is measured from.
func Diff(prev, cur Snapshot, counters map[string][]string, origin time.Time) (Interval, []error) {
	iv := Interval{StartS: prev.Time.Sub(origin).Seconds(), DurationS: cur.Time.Sub(prev.Time).Seconds()}
	var errs []error
	iv.CPU = partDelta(&errs, "cpu", CPUDelta, prev.CPU, cur.CPU)
	iv.Softirqs = partDelta(&errs, "softirqs", SoftirqDeltas, prev.Softirqs, cur.Softirqs)
	if prev.Interrupts.Rows == nil || cur.Interrupts.Rows == nil {
		errs = append(errs, fmt.Errorf("interrupts: /proc/interrupts not read"))
	} else {
		iv.Interrupts = partDelta(&errs, "interrupts", InterruptDeltas, prev.Interrupts, cur.Interrupts)
	}
	iv.Softnet = partDelta(&errs, "softnet", SoftnetDeltas, prev.Softnet, cur.Softnet)
	for _, ns := range slices.Sorted(maps.Keys(counters)) {
		p, ok1 := prev.Nstat[ns]
		c, ok2 := cur.Nstat[ns]
		if !ok1 || !ok2 {
			errs = append(errs, fmt.Errorf("nstat %q: not in both snapshots", ns))
			continue
		}
		d, err := CounterDeltas(p, c, counters[ns])
		if err != nil {
			errs = append(errs, fmt.Errorf("nstat %q: %w", ns, err))
			continue
		}
		if iv.Nstat == nil {
			iv.Nstat = map[string]map[string]int64{}
		}
		iv.Nstat[ns] = d
	}
	return iv, errs
}

// partDelta computes one part of an interval. A failed part is left out (nil) and its error is
// added to errs under the part's name, so one bad file does not cost the other parts.
func partDelta[S, D any](errs *[]error, part string, delta func(prev, cur S) (D, error), prev, cur S) *D {
	d, err := delta(prev, cur)
	if err != nil {
		*errs = append(*errs, fmt.Errorf("%s: %w", part, err))
		return nil
	}
	return &d
}

// SamplerConfig says what a Sampler records.
type SamplerConfig struct {
	// Interval is the time-series period (e.g. 250 ms); 0 records totals only. Below ~100 ms
	// some samples may lack CPU shares (see Report.EmptyCPUSamples).
	Interval time.Duration
	// Namespaces maps a network namespace name (or path; "" = the caller's namespace) to the
	// "Group.Name" counters to record there; a nil or empty list means DefaultCounters.
	Namespaces map[string][]string
	// SeriesSoftirqs are the softirq rows kept in time-series samples (totals keep all rows);
	// nil means NET_RX and NET_TX.
	SeriesSoftirqs []string
}

// Report is the result of one sampled run; it goes verbatim into result files.
type Report struct {
	Start      time.Time  `json:"start"`
	End        time.Time  `json:"end"`
	DurationS  float64    `json:"duration_s"`
	IntervalMS float64    `json:"interval_ms"` // time-series period; 0 = no series
	Totals     Interval   `json:"totals"`
	Series     []Interval `json:"series,omitempty"`
	// MissingCounters lists, per namespace, requested counters this kernel does not have.
	MissingCounters map[string][]string `json:"missing_counters,omitempty"`
	// EmptyCPUSamples counts series samples without CPU shares (no jiffies accounted on some
	// CPU; see Sampler). Many of them mean the interval is too short for tick accounting.
	EmptyCPUSamples int      `json:"empty_cpu_samples,omitempty"`
	Errors          []string `json:"errors,omitempty"`
}

// maxErrors bounds Report.Errors: a probe failing every 250 ms for an hour must not bloat results.
const maxErrors = 32

// Sampler snapshots the probes at Start and Stop, and optionally every Interval in between.
type Sampler struct {
	cfg      SamplerConfig
	counters map[string][]string // per namespace, the requested counters that exist

	mu       sync.Mutex
	start    Snapshot
	last     Snapshot
	series   []Interval
	missing  map[string][]string
	errs     []string
	dropped  int
	emptyCPU int
	stop     chan struct{}
	done     chan struct{}
	state    int // 0 new, 1 running, 2 stopped
}

// NewSampler returns a Sampler; nothing is read until Start.
func NewSampler(cfg SamplerConfig) *Sampler {
	if cfg.SeriesSoftirqs == nil {
		cfg.SeriesSoftirqs = []string{"NET_RX", "NET_TX"}
	}
	return &Sampler{cfg: cfg}
}

// Start takes the first snapshot and starts the periodic sampling goroutine. It fails if a probe
// file or a namespace cannot be read.
func (s *Sampler) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != 0 {
		return errors.New("probe: sampler already started")
	}
	snap, err := TakeSnapshot(slices.Sorted(maps.Keys(s.cfg.Namespaces)))
	if err != nil {
		return err
	}
	s.counters = map[string][]string{}
	s.missing = map[string][]string{}
	for ns, want := range s.cfg.Namespaces {
		if len(want) == 0 {
			want = DefaultCounters
		}
		for _, n := range want {
			if _, ok := snap.Nstat[ns][n]; ok {
				s.counters[ns] = append(s.counters[ns], n)
			} else {
				s.missing[ns] = append(s.missing[ns], n)
			}
		}
		if s.counters[ns] == nil {
			s.counters[ns] = []string{} // non-nil: "none", not "all"
		}
	}
	s.start, s.last, s.state = snap, snap, 1
	if s.cfg.Interval > 0 {
		s.stop, s.done = make(chan struct{}), make(chan struct{})
		go s.loop()
	}
	return nil
}

func (s *Sampler) loop() {
	defer close(s.done)
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			snap, err := TakeSnapshot(slices.Sorted(maps.Keys(s.counters)))
			s.mu.Lock()
			if err != nil {
				s.addErr(fmt.Errorf("sample: %w", err))
			} else {
				s.appendSample(snap)
			}
			s.mu.Unlock()
		}
	}
}

// appendSample adds the interval from the last snapshot to snap to the series. Called with mu held.
//
// A sample in which some CPU accounted no jiffies gets no CPU part, without an error: it happens
// for the final partial sample and, on a loaded VM, for intervals of a few tens of ms (seen with
// 40 ms on the 2-vCPU lab VM) because the kernel accounts CPU time in ticks. No time is lost: the
// next sample's CPU part picks it up. Report.EmptyCPUSamples counts them.
func (s *Sampler) appendSample(snap Snapshot) {
	iv, errs := Diff(s.last, snap, s.counters, s.start.Time)
	for _, e := range errs {
		if errors.Is(e, ErrEmptyInterval) {
			s.emptyCPU++
			continue
		}
		s.addErr(fmt.Errorf("sample at %.3fs: %w", iv.StartS, e))
	}
	if iv.Softirqs != nil {
		d := iv.Softirqs.Only(s.cfg.SeriesSoftirqs...)
		iv.Softirqs = &d
	}
	s.series = append(s.series, iv)
	s.last = snap
}

func (s *Sampler) addErr(err error) {
	if len(s.errs) < maxErrors {
		s.errs = append(s.errs, err.Error())
	} else {
		s.dropped++
	}
}

// Stop ends sampling, takes the final snapshot and returns the report. It returns an error only
// if the final snapshot cannot be taken; failures of single deltas are listed in Report.Errors.
func (s *Sampler) Stop() (*Report, error) {
	s.mu.Lock()
	if s.state != 1 {
		s.mu.Unlock()
		return nil, errors.New("probe: sampler not running")
	}
	s.state = 2
	s.mu.Unlock()
	if s.stop != nil {
		close(s.stop)
		<-s.done
	}
	snap, err := TakeSnapshot(slices.Sorted(maps.Keys(s.counters)))
	if err != nil {
		return nil, fmt.Errorf("final snapshot: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cfg.Interval > 0 {
		s.appendSample(snap)
	}
	tot, errs := Diff(s.start, snap, s.counters, s.start.Time)
	for _, e := range errs {
		s.addErr(fmt.Errorf("totals: %w", e))
	}
	if s.dropped > 0 {
		s.errs = append(s.errs, fmt.Sprintf("%d more errors not shown", s.dropped))
	}
	r := &Report{
		Start: s.start.Time, End: snap.Time, DurationS: snap.Time.Sub(s.start.Time).Seconds(),
		IntervalMS: float64(s.cfg.Interval) / float64(time.Millisecond),
		Totals:     tot, Series: s.series, EmptyCPUSamples: s.emptyCPU, Errors: s.errs,
	}
	for ns, m := range s.missing {
		if len(m) > 0 {
			if r.MissingCounters == nil {
				r.MissingCounters = map[string][]string{}
			}
			r.MissingCounters[ns] = slices.Clone(m)
		}
	}
	return r, nil
}
