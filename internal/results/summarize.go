package results

import (
	"math"
	"sort"
	"strings"
)

// Measured reports whether a repetition counts in summaries: not a warm-up and not failed.
func (r *Rep) Measured() bool { return !r.Warmup && r.Error == "" }

// MeasuredReps returns the repetitions that count in summaries, in order.
func (p *Point) MeasuredReps() []*Rep {
	var out []*Rep
	for i := range p.Reps {
		if p.Reps[i].Measured() {
			out = append(out, &p.Reps[i])
		}
	}
	return out
}

// metricValue returns a rep's value of a metric, deriving softirq totals from the per-CPU
// vectors when the tool did not report them (so NET_RX vs size can be plotted and compared
// like any other metric).
func (r *Rep) metricValue(name string) (float64, bool) {
	if v, ok := r.Metrics[name]; ok {
		return v, true
	}
	if sirq, ok := softirqName(name); ok {
		if vec, ok := r.Softirqs[sirq]; ok {
			return float64(sumU64(vec)), true
		}
	}
	if len(r.Interrupts) > 0 {
		if name == MetricIRQs {
			var t uint64
			for _, vec := range r.Interrupts {
				t += sumU64(vec)
			}
			return float64(t), true
		}
		for k, vec := range r.Interrupts {
			if name == IRQMetric(k) {
				return float64(sumU64(vec)), true
			}
		}
	}
	return 0, false
}

// SetInterrupts records a repetition's interrupt deltas (kind -> count per CPU) and fills
// irqs_count (all of them) and irqs_<kind>_count for every kind.
func (r *Rep) SetInterrupts(byKind map[string][]uint64) {
	if len(byKind) == 0 {
		return
	}
	if r.Metrics == nil {
		r.Metrics = map[string]float64{}
	}
	r.Interrupts = map[string][]uint64{}
	var total uint64
	for k, vec := range byKind {
		r.Interrupts[k] = append([]uint64(nil), vec...)
		n := sumU64(vec)
		total += n
		r.Metrics[IRQMetric(k)] = float64(n)
	}
	r.Metrics[MetricIRQs] = float64(total)
}

// Value is the value of a metric in this rep, including derived softirq totals.
func (r *Rep) Value(name string) (float64, bool) { return r.metricValue(name) }

// softirqName maps "softirqs_net_rx_count" back to "NET_RX".
func softirqName(metric string) (string, bool) {
	if !strings.HasPrefix(metric, "softirqs_") || !strings.HasSuffix(metric, "_count") {
		return "", false
	}
	n := strings.TrimSuffix(strings.TrimPrefix(metric, "softirqs_"), "_count")
	return strings.ToUpper(n), n != ""
}

// metricNames lists every metric any measured rep of the point has, derived ones included, sorted.
func (p *Point) metricNames() []string {
	set := map[string]bool{}
	for _, r := range p.MeasuredReps() {
		for k := range r.Metrics {
			set[k] = true
		}
		for k := range r.Softirqs {
			set[SoftirqMetric(k)] = true
		}
		for k := range r.Interrupts {
			set[IRQMetric(k)] = true
			set[MetricIRQs] = true
		}
	}
	names := make([]string, 0, len(set))
	for k := range set {
		names = append(names, k)
	}
	sort.Strings(names)
	return names
}

// Summarize fills p.Summary with median, min and max of every metric over the measured
// repetitions (not warm-ups, not failed). A metric a rep lacks is skipped for that rep only, so
// N can differ between metrics. NaN values are skipped too.
func Summarize(p *Point) {
	p.Summary = map[string]Stat{}
	for _, name := range p.metricNames() {
		var vals []float64
		for _, r := range p.MeasuredReps() {
			if v, ok := r.metricValue(name); ok && !math.IsNaN(v) {
				vals = append(vals, v)
			}
		}
		if len(vals) > 0 {
			p.Summary[name] = StatOf(vals)
		}
	}
}

// SummarizeAll summarizes every point of the run and notes how its flows share client/server
// pairs (FlowSharingNote) when it sweeps more than one flow.
func (r *Run) SummarizeAll() {
	for i := range r.Points {
		Summarize(&r.Points[i])
	}
	r.addFlowNote()
}

// StatOf summarizes values; the median of an even count is the mean of the two middle values.
func StatOf(vals []float64) Stat {
	if len(vals) == 0 {
		return Stat{}
	}
	s := append([]float64(nil), vals...)
	sort.Float64s(s)
	n := len(s)
	med := s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return Stat{Median: med, Min: s[0], Max: s[n-1], N: n}
}

func sumU64(v []uint64) uint64 {
	var t uint64
	for _, x := range v {
		t += x
	}
	return t
}
