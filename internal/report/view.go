package report

import (
	"cmp"
	"slices"

	"github.com/peregrine-net/peregrine/internal/results"
)

// view is what both renderers need from a run: its derived figures (results.Figures: the
// summaries, main metrics, baseline and ratios, computed in results, never here) laid out for
// display, points sorted by X then config declaration order, and the X keys that vary.
type view struct {
	run      *results.Run
	fig      *results.Figures
	configs  []string
	varying  []string           // X keys whose value differs between points
	fixed    map[string]float64 // X keys with one value throughout
	points   []pointView        // sorted by X, then config declaration order
	metrics  []string           // main metrics, primary first
	primary  string
	baseline string
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

// extraPlotted are plotted against X when present but kept out of the table.
var extraPlotted = []string{results.MetricNetRX, results.MetricIRQs, results.IRQMetric("cal")}

func newView(run *results.Run) *view {
	fig := results.FiguresOf(run)
	v := &view{run: run, fig: fig, configs: run.ConfigNames(), metrics: fig.Metrics, primary: fig.Primary, baseline: fig.Baseline}
	order := map[string]int{}
	for i, c := range v.configs {
		order[c] = i
	}
	for i := range run.Points {
		p := &run.Points[i]
		v.points = append(v.points, pointView{p: p, sum: fig.Summary(p)})
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
	return v
}

func (v *view) ratio(metric string, p *results.Point) (results.Ratio, bool) {
	return v.fig.Ratio(metric, p)
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
