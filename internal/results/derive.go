package results

import "slices"

// MainMetrics are the metrics a reader looks for first, in the order tables, plots and ratio
// lists show them; the others stay in the file.
var MainMetrics = []string{
	MetricThroughput, MetricDeliveredPPS, MetricRequests,
	MetricLatencyP50, MetricLatencyP99, MetricLatencyP999, MetricLatencyAvg,
	MetricLoss, MetricRetransSegs, MetricDrops, MetricCPUBusy,
}

// costMetricsCompared are the cost figures every run also states as ratios against the
// baseline: the whole machine's and the receive path's ns per delivered packet.
var costMetricsCompared = []string{MetricCostReceive, MetricCostCPU, MetricCostBPF}

// Derive computes a measured run's derived figures in place, replacing earlier ones: every
// rep's cost metrics, every point's summary (and the flow note), and the ratios against the
// scenario's baseline of its primary metric and of the cost figures, where both sides have
// them. A producer calls it once when its run ends; Figures reads the figures back.
func (r *Run) Derive() {
	r.ComputeCosts()
	r.SummarizeAll()
	r.Ratios = nil
	if len(r.Points) == 0 {
		return
	}
	metrics := []string{r.Scenario.Primary}
	for _, m := range costMetricsCompared {
		if m != r.Scenario.Primary {
			metrics = append(metrics, m)
		}
	}
	for _, m := range metrics {
		if rs, err := ComputeRatios(r, m, r.Scenario.Baseline); err == nil {
			r.Ratios = append(r.Ratios, rs...)
		}
	}
}

// Figures are a run's derived figures as its readers use them: taken from the file where it
// has them, and computed here where it does not (a file written before summarizing, a main
// metric whose ratio was not stored), so a report never shows a figure the file disagrees with
// and never computes one itself. The run is not modified.
type Figures struct {
	Primary  string   // the headline metric: the scenario's, else the first main metric present
	Metrics  []string // the main metrics some point has, Primary first
	Baseline string   // the config every other is compared with
	sums     map[*Point]map[string]Stat
	ratios   map[string]Ratio
}

// FiguresOf derives the figures of run. Points are identified by their address in run.Points.
func FiguresOf(run *Run) *Figures {
	f := &Figures{sums: map[*Point]map[string]Stat{}, ratios: map[string]Ratio{}}
	have := map[string]bool{}
	for i := range run.Points {
		p := &run.Points[i]
		sum := p.Summary
		if sum == nil { // summarize a copy: the run stays as read
			cp := *p
			Summarize(&cp)
			sum = cp.Summary
		}
		for m := range sum {
			have[m] = true
		}
		f.sums[p] = sum
	}
	f.Primary = run.Scenario.Primary
	if f.Primary != "" && have[f.Primary] {
		f.Metrics = append(f.Metrics, f.Primary)
	}
	for _, m := range MainMetrics {
		if have[m] && m != f.Primary {
			f.Metrics = append(f.Metrics, m)
		}
	}
	if f.Primary == "" && len(f.Metrics) > 0 {
		f.Primary = f.Metrics[0]
	}
	configs := run.ConfigNames()
	f.Baseline = pickBaseline(run, configs)
	for _, r := range run.Ratios {
		if r.Denominator == f.Baseline {
			f.ratios[ratioKey(r.Metric, r.Numerator, r.X)] = r
		}
	}
	if f.Baseline == "" || len(configs) < 2 {
		return f
	}
	for _, m := range f.Metrics {
		rs, err := ComputeRatios(run, m, f.Baseline)
		if err != nil {
			continue // metric missing for the baseline: nothing to compare
		}
		for _, r := range rs {
			if k := ratioKey(r.Metric, r.Numerator, r.X); f.ratios[k].Metric == "" {
				f.ratios[k] = r
			}
		}
	}
	return f
}

// pickBaseline: the scenario's baseline, else the denominator the run's ratios use, else the
// first config.
func pickBaseline(run *Run, configs []string) string {
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

func ratioKey(metric, numerator string, x map[string]float64) string {
	return metric + "|" + numerator + "|" + XKey(x)
}

// Summary is a point's median, min and max of every metric.
func (f *Figures) Summary(p *Point) map[string]Stat { return f.sums[p] }

// Ratio is a point's ratio against the baseline at the same X on one metric.
func (f *Figures) Ratio(metric string, p *Point) (Ratio, bool) {
	r, ok := f.ratios[ratioKey(metric, p.Config, p.X)]
	return r, ok
}

// MedianOver is the median of value over a point's measured reps that have it (counters,
// derived values); false when none has.
func (p *Point) MedianOver(value func(r *Rep) (float64, bool)) (float64, bool) {
	var xs []float64
	for _, r := range p.MeasuredReps() {
		if v, ok := value(r); ok {
			xs = append(xs, v)
		}
	}
	if len(xs) == 0 {
		return 0, false
	}
	return StatOf(xs).Median, true
}
