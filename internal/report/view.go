package report

import (
	"cmp"
	"slices"

	"github.com/peregrine-net/peregrine/internal/results"
)

// view is what both renderers need from a run, derived once: ordering, the X keys that vary,
// summaries (computed here when the file has none) and ratios against the baseline.
type view struct {
	run      *results.Run
	configs  []string
	varying  []string           // X keys whose value differs between points
	fixed    map[string]float64 // X keys with one value throughout
	points   []pointView        // sorted by X, then config declaration order
	metrics  []string           // main metrics, primary first
	primary  string
	baseline string
	ratios   map[string]results.Ratio // ratioKey(metric, numerator, x)
}

// rowStart is a point's first cells: its config, then its value of each varying X key
// (missing where the point lacks the key).
func (v *view) rowStart(pv pointView, missing string) []string {
	row := []string{pv.p.Config}
	for _, k := range v.varying {
		if x, ok := pv.p.X[k]; ok {
			row = append(row, xnum(x))
		} else {
			row = append(row, missing)
		}
	}
	return row
}

type pointView struct {
	p   *results.Point
	sum map[string]results.Stat
}

// preferred orders the metrics a reader looks for first; others are left to the JSON.
var preferred = []string{
	results.MetricThroughput, results.MetricDeliveredPPS, results.MetricRequests,
	results.MetricLatencyP50, results.MetricLatencyP99, results.MetricLatencyP999, results.MetricLatencyAvg,
	results.MetricLoss, results.MetricCPUBusy,
}

// extraPlotted are plotted against X when present but kept out of the table.
var extraPlotted = []string{results.MetricNetRX, results.MetricIRQs, results.IRQMetric("cal")}

func newView(run *results.Run) *view {
	v := &view{run: run, configs: run.ConfigNames(), fixed: map[string]float64{}, ratios: map[string]results.Ratio{}}
	order := map[string]int{}
	for i, c := range v.configs {
		order[c] = i
	}
	have := map[string]bool{}
	for i := range run.Points {
		p := &run.Points[i]
		sum := p.Summary
		if sum == nil { // a file written before summarizing: compute on a copy, leave the run alone
			cp := *p
			results.Summarize(&cp)
			sum = cp.Summary
		}
		for m := range sum {
			have[m] = true
		}
		v.points = append(v.points, pointView{p: p, sum: sum})
	}
	v.varying, v.fixed = splitX(run.Points)
	slices.SortStableFunc(v.points, func(a, b pointView) int {
		for _, k := range v.varying {
			if c := cmp.Compare(a.p.X[k], b.p.X[k]); c != 0 {
				return c
			}
		}
		return cmp.Compare(order[a.p.Config], order[b.p.Config])
	})

	v.primary = run.Scenario.Primary
	if v.primary != "" && have[v.primary] {
		v.metrics = append(v.metrics, v.primary)
	}
	for _, m := range preferred {
		if have[m] && m != v.primary {
			v.metrics = append(v.metrics, m)
		}
	}
	if v.primary == "" && len(v.metrics) > 0 {
		v.primary = v.metrics[0]
	}
	v.baseline = pickBaseline(run, v.configs)
	v.loadRatios()
	return v
}

// pickBaseline: the scenario's baseline, else the denominator the run's ratios use, else the
// first config.
func pickBaseline(run *results.Run, configs []string) string {
	if b := run.Scenario.Baseline; b != "" && slices.Contains(configs, b) {
		return b
	}
	if len(run.Ratios) > 0 {
		return run.Ratios[0].Denominator
	}
	if len(configs) > 0 {
		return configs[0]
	}
	return ""
}

// loadRatios takes the run's own ratios against the baseline and computes the missing ones for
// every main metric, so a report never shows a ratio the file disagrees with.
func (v *view) loadRatios() {
	for _, r := range v.run.Ratios {
		if r.Denominator == v.baseline {
			v.ratios[ratioKey(r.Metric, r.Numerator, r.X)] = r
		}
	}
	if v.baseline == "" || len(v.configs) < 2 {
		return
	}
	for _, m := range v.metrics {
		rs, err := results.ComputeRatios(v.run, m, v.baseline)
		if err != nil {
			continue // metric missing for the baseline: nothing to compare
		}
		for _, r := range rs {
			k := ratioKey(r.Metric, r.Numerator, r.X)
			if _, ok := v.ratios[k]; !ok {
				v.ratios[k] = r
			}
		}
	}
}

func ratioKey(metric, numerator string, x map[string]float64) string {
	return metric + "|" + numerator + "|" + results.XKey(x)
}

func (v *view) ratio(metric string, p *results.Point) (results.Ratio, bool) {
	r, ok := v.ratios[ratioKey(metric, p.Config, p.X)]
	return r, ok
}

// sortedRatios lists the ratios for display: by metric order, X, numerator order.
func (v *view) sortedRatios() []results.Ratio {
	var out []results.Ratio
	for _, m := range v.metrics {
		for _, pv := range v.points {
			if r, ok := v.ratio(m, pv.p); ok {
				out = append(out, r)
			}
		}
	}
	return out
}

// splitX separates X keys that vary across points from those that are constant.
func splitX(points []results.Point) (varying []string, fixed map[string]float64) {
	fixed = map[string]float64{}
	vals := map[string]map[float64]bool{}
	count := map[string]int{}
	for _, p := range points {
		for k, x := range p.X {
			if vals[k] == nil {
				vals[k] = map[float64]bool{}
			}
			vals[k][x] = true
			count[k]++
		}
	}
	for k, set := range vals {
		if len(set) > 1 || count[k] < len(points) {
			varying = append(varying, k)
		} else {
			for x := range set {
				fixed[k] = x
			}
		}
	}
	slices.Sort(varying)
	return varying, fixed
}
