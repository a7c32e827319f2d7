package results

import (
	"fmt"
	"math"
	"sort"
)

// Tolerances of Validate.
const (
	// CPUShareTolerance: one CPU's shares must sum to 1 within this (sampling granularity of
	// /proc/stat jiffies makes exact 1 rare).
	CPUShareTolerance = 0.02
	// deliveredSlack: delivered may exceed sent by this relative amount, because the two sides
	// are sampled over windows that differ by a few milliseconds.
	deliveredSlack = 1e-3
)

// Validate checks the run's internal consistency and returns every problem found (nil when
// none). Each error names where it is (point config and X, rep index). It never modifies the run.
func (r *Run) Validate() []error {
	v := &validator{}
	r.validateHead(v)
	configs := map[string]bool{}
	for i, c := range r.Configs {
		if c.Name == "" {
			v.add("configs[%d]: empty name", i)
		} else if configs[c.Name] {
			v.add("configs[%d]: duplicate name %q", i, c.Name)
		}
		configs[c.Name] = true
		if c.Placement != "" && c.Placement != PlacementUnknown && !c.Placement.Known() {
			v.add("configs[%d]: unknown placement class %q", i, c.Placement)
		}
	}
	seen := map[string]int{}
	for i := range r.Points {
		p := &r.Points[i]
		where := fmt.Sprintf("points[%d] (%s %s)", i, p.Config, XKey(p.X))
		if !configs[p.Config] {
			v.add("%s: config %q is not declared in configs", where, p.Config)
		}
		key := p.Config + " " + XKey(p.X)
		if j, dup := seen[key]; dup {
			v.add("%s: same config and x as points[%d]", where, j)
		}
		seen[key] = i
		r.validatePoint(v, where, p)
	}
	for i, rt := range r.Ratios {
		for _, c := range []string{rt.Numerator, rt.Denominator} {
			if !configs[c] {
				v.add("ratios[%d]: config %q is not declared in configs", i, c)
			}
		}
	}
	return v.errs
}

type validator struct{ errs []error }

func (v *validator) add(format string, args ...any) {
	v.errs = append(v.errs, fmt.Errorf(format, args...))
}

func (r *Run) validateHead(v *validator) {
	if err := CheckSchema(r.Schema); err != nil {
		v.add("schema: %v", err)
	}
	if r.Started.IsZero() {
		v.add("started: missing")
	}
	if r.Complete && r.Finished.IsZero() {
		v.add("complete run has no finished time")
	}
	if !r.Finished.IsZero() && r.Finished.Before(r.Started) {
		v.add("finished %s is before started %s", r.Finished, r.Started)
	}
	if r.Complete && r.Error != "" {
		v.add("complete run carries an error: %q", r.Error)
	}
	if r.Env.CPUs < 0 {
		v.add("env.cpus: negative (%d)", r.Env.CPUs)
	}
}

func (r *Run) validatePoint(v *validator, where string, p *Point) {
	for k, x := range p.X {
		if math.IsNaN(x) || math.IsInf(x, 0) {
			v.add("%s: x[%s] is %v", where, k, x)
		}
	}
	indices := map[int]bool{}
	for i := range p.Reps {
		rep := &p.Reps[i]
		rw := fmt.Sprintf("%s rep %d", where, rep.Index)
		if indices[rep.Index] {
			v.add("%s: duplicate rep index", rw)
		}
		indices[rep.Index] = true
		r.validateRep(v, rw, rep)
	}
	for name, s := range p.Summary {
		if s.N > 0 && !(s.Min <= s.Median && s.Median <= s.Max) {
			v.add("%s: summary %s: not min <= median <= max (%g, %g, %g)", where, name, s.Min, s.Median, s.Max)
		}
		if s.N > len(p.Reps) {
			v.add("%s: summary %s: n=%d exceeds %d reps", where, name, s.N, len(p.Reps))
		}
	}
}

func (r *Run) validateRep(v *validator, where string, rep *Rep) {
	for _, name := range sortedKeys(rep.Metrics) {
		if x := rep.Metrics[name]; math.IsNaN(x) || math.IsInf(x, 0) {
			v.add("%s: metric %s is %v", where, name, x)
		}
	}
	for _, pair := range deliveredSent {
		d, okd := rep.Metrics[pair[0]]
		s, oks := rep.Metrics[pair[1]]
		if okd && oks && d > s*(1+deliveredSlack) {
			v.add("%s: %s %g exceeds %s %g", where, pair[0], d, pair[1], s)
		}
	}
	if f, ok := rep.Metrics[MetricLoss]; ok && (f < 0 || f > 1) {
		v.add("%s: %s %g outside 0..1", where, MetricLoss, f)
	}
	cpus := map[int]bool{}
	for _, c := range rep.CPU {
		if cpus[c.CPU] {
			v.add("%s: cpu %d listed twice", where, c.CPU)
		}
		cpus[c.CPU] = true
		r.checkCPUIndex(v, where, "cpu share", c.CPU)
		for _, f := range []float64{c.User, c.System, c.IRQ, c.Softirq, c.Idle, c.Steal} {
			if f < 0 || f > 1+CPUShareTolerance || math.IsNaN(f) {
				v.add("%s: cpu %d: share %g outside 0..1", where, c.CPU, f)
				break
			}
		}
		if s := c.Sum(); math.Abs(s-1) > CPUShareTolerance {
			v.add("%s: cpu %d: shares sum to %.3f, want 1±%.2f", where, c.CPU, s, CPUShareTolerance)
		}
	}
	for _, name := range sortedKeys(rep.Softirqs) {
		vec := rep.Softirqs[name]
		if r.Env.CPUs > 0 && len(vec) != r.Env.CPUs {
			v.add("%s: softirqs %s has %d per-CPU counts, env has %d CPUs", where, name, len(vec), r.Env.CPUs)
		}
		if total, ok := rep.Metrics[SoftirqMetric(name)]; ok && total != float64(sumU64(vec)) {
			v.add("%s: %s %g differs from the per-CPU sum %d", where, SoftirqMetric(name), total, sumU64(vec))
		}
	}
	var irqs uint64
	for _, kind := range sortedKeys(rep.Interrupts) {
		vec := rep.Interrupts[kind]
		if r.Env.CPUs > 0 && len(vec) < r.Env.CPUs {
			v.add("%s: interrupts %s has %d per-CPU counts, env has %d CPUs", where, kind, len(vec), r.Env.CPUs)
		}
		if total, ok := rep.Metrics[IRQMetric(kind)]; ok && total != float64(sumU64(vec)) {
			v.add("%s: %s %g differs from the per-CPU sum %d", where, IRQMetric(kind), total, sumU64(vec))
		}
		irqs += sumU64(vec)
	}
	if total, ok := rep.Metrics[MetricIRQs]; ok && len(rep.Interrupts) > 0 && total != float64(irqs) {
		v.add("%s: %s %g differs from the sum over kinds and CPUs %d", where, MetricIRQs, total, irqs)
	}
	for _, st := range rep.Stages {
		if st.Stage == "" {
			v.add("%s: stage entry without a stage name (device %q)", where, st.Device)
		}
		r.checkCPUIndex(v, where, "stage "+st.Stage, st.CPU)
	}
	if rep.Duration < 0 {
		v.add("%s: negative duration", where)
	}
}

func (r *Run) checkCPUIndex(v *validator, where, what string, cpu int) {
	if cpu < 0 || (r.Env.CPUs > 0 && cpu >= r.Env.CPUs) {
		v.add("%s: %s: cpu %d outside 0..%d", where, what, cpu, r.Env.CPUs-1)
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
