package results

import (
	"fmt"
	"maps"
	"math"
	"sort"
	"strconv"
	"strings"
)

// ComputeRatios compares every config of the run with the denominator config on one metric, at
// every X where both have a median. Median is the ratio of medians. When the scenario's
// repetitions were interleaved, Min/Max are the extremes of the ratios of same-index rep pairs
// (rep i of both configs ran side by side); otherwise they are the widest bounds the two
// spreads allow. Summaries are computed on the fly, so the run need not be summarized first.
// Ratios that would divide by zero are left out. The run is not modified; append the result to
// Run.Ratios to keep it.
func ComputeRatios(run *Run, metric, denominator string) ([]Ratio, error) {
	if run.Config(denominator) == nil && !hasPointsFor(run, denominator) {
		return nil, fmt.Errorf("ratios: denominator config %q is not in the run (configs: %s)",
			denominator, strings.Join(run.ConfigNames(), ", "))
	}
	dens := map[string]*Point{}
	for i := range run.Points {
		if p := &run.Points[i]; p.Config == denominator {
			dens[XKey(p.X)] = p
		}
	}
	var out []Ratio
	for i := range run.Points {
		num := &run.Points[i]
		if num.Config == denominator {
			continue
		}
		den, ok := dens[XKey(num.X)]
		if !ok {
			continue
		}
		rt, ok := ratioOf(run.Scenario.Interleaved, metric, num, den)
		if !ok || !finite(rt.Median, rt.Min, rt.Max) {
			// A zero denominator makes the ratio meaningless (and JSON cannot carry NaN/Inf).
			continue
		}
		out = append(out, rt)
	}
	if len(out) == 0 && !anyHasMetric(run, metric) {
		return nil, fmt.Errorf("ratios: no measured repetition has metric %q", metric)
	}
	return out, nil
}

func ratioOf(interleaved bool, metric string, num, den *Point) (Ratio, bool) {
	nv, dv := repValues(num, metric), repValues(den, metric)
	if len(nv) == 0 || len(dv) == 0 {
		return Ratio{}, false
	}
	ns, ds := StatOf(values(nv)), StatOf(values(dv))
	rt := Ratio{Metric: metric, Numerator: num.Config, Denominator: den.Config,
		X: maps.Clone(num.X), Median: div(ns.Median, ds.Median)}
	if interleaved {
		var pr []float64
		for idx, n := range nv {
			if d, ok := dv[idx]; ok && d != 0 {
				pr = append(pr, div(n, d))
			}
		}
		if len(pr) > 0 {
			s := StatOf(pr)
			rt.Min, rt.Max, rt.N, rt.Spread = s.Min, s.Max, s.N, SpreadPairs
			return rt, true
		}
		// Interleaved in plan but no common indices survived (failed reps): fall back to bounds.
	}
	rt.Min, rt.Max = div(ns.Min, ds.Max), div(ns.Max, ds.Min)
	rt.N, rt.Spread = min(ns.N, ds.N), SpreadBounds
	return rt, true
}

// repValues maps rep index -> value over the measured reps that have the metric.
func repValues(p *Point, metric string) map[int]float64 {
	out := map[int]float64{}
	for _, r := range p.MeasuredReps() {
		if v, ok := r.metricValue(metric); ok && !math.IsNaN(v) {
			out[r.Index] = v
		}
	}
	return out
}

func values(m map[int]float64) []float64 {
	out := make([]float64, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

func finite(vs ...float64) bool {
	for _, v := range vs {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return false
		}
	}
	return true
}

// div returns a/b, or NaN when b is zero: a ratio against nothing is undefined, not infinite.
func div(a, b float64) float64 {
	if b == 0 {
		return math.NaN()
	}
	return a / b
}

func anyHasMetric(run *Run, metric string) bool {
	for i := range run.Points {
		if len(repValues(&run.Points[i], metric)) > 0 {
			return true
		}
	}
	return false
}

func hasPointsFor(run *Run, config string) bool {
	for i := range run.Points {
		if run.Points[i].Config == config {
			return true
		}
	}
	return false
}

// Config finds a config by name, nil when absent.
func (r *Run) Config(name string) *Config {
	for i := range r.Configs {
		if r.Configs[i].Name == name {
			return &r.Configs[i]
		}
	}
	return nil
}

// ConfigNames lists the configs in declaration order, then any that only points mention.
func (r *Run) ConfigNames() []string {
	var out []string
	seen := map[string]bool{}
	add := func(n string) {
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	for _, c := range r.Configs {
		add(c.Name)
	}
	for _, p := range r.Points {
		add(p.Config)
	}
	return out
}

// XKey is a canonical string for an X position ("flows=1,size=64"), usable as a map key and
// as a label.
func XKey(x map[string]float64) string {
	keys := make([]string, 0, len(x))
	for k := range x {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + strconv.FormatFloat(x[k], 'g', -1, 64)
	}
	return strings.Join(parts, ",")
}
