package report

import (
	"fmt"
	"math"
	"slices"
	"sort"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/peregrine-net/peregrine/internal/results"
	"github.com/peregrine-net/peregrine/internal/results/format"
)

// errPoints are medians with min/max as error bars (offsets below and above the median).
type errPoints struct {
	plotter.XYs
	plotter.YErrors
}

// series is one line of a metric-vs-X chart: a config, plus the values of any other varying key.
type series struct {
	name   string
	config int // index into configs, for the colour
	pts    errPoints
}

// metricVsX draws one metric against one varying X key, a line per config with min–max error
// bars. Returns nil when no point has the metric.
func metricVsX(v *view, metric, key string) (*chart, error) {
	others := slices.DeleteFunc(slices.Clone(v.varying), func(k string) bool { return k == key })
	byName := map[string]*series{}
	var order []string
	var xs []float64
	maxY := 0.0
	for _, pv := range v.points {
		st, ok := pv.sum[metric]
		x, okx := pv.p.X[key]
		if !ok || !okx || math.IsNaN(st.Median) {
			continue
		}
		name := pv.p.Config
		if len(others) > 0 {
			sub := map[string]float64{}
			for _, k := range others {
				if ox, ok := pv.p.X[k]; ok {
					sub[k] = ox
				}
			}
			name += " " + results.XKey(sub)
		}
		s := byName[name]
		if s == nil {
			s = &series{name: name, config: slices.Index(v.configs, pv.p.Config)}
			byName[name] = s
			order = append(order, name)
		}
		s.pts.XYs = append(s.pts.XYs, plotter.XY{X: x, Y: st.Median})
		s.pts.YErrors = append(s.pts.YErrors, struct{ Low, High float64 }{st.Median - st.Min, st.Max - st.Median})
		xs = append(xs, x)
		maxY = max(maxY, st.Max)
	}
	if len(order) == 0 {
		return nil, nil
	}
	sc := format.For(metric, maxY)
	ylabel := axisLabel(metric, sc)
	c := &chart{p: newPlot(fmt.Sprintf("%s vs %s", metricTitle(metric), xTitleShort(key)), xTitle(key), ylabel)}
	setXTicks(c.p, key, xs)
	c.p.Y.Min = 0 // rates and latencies read honestly only from zero
	c.p.Add(plotter.NewGrid())
	for i, name := range order {
		s := byName[name]
		sort.Sort(byX(s.pts))
		for j := range s.pts.XYs {
			s.pts.XYs[j].Y /= sc.Div
			s.pts.YErrors[j].Low /= sc.Div
			s.pts.YErrors[j].High /= sc.Div
		}
		col := colorAt(s.config)
		line, pts, err := plotter.NewLinePoints(s.pts.XYs)
		if err != nil {
			return nil, fmt.Errorf("plot %s: %w", metric, err)
		}
		line.Color = col
		line.Width = vg.Points(1.8)
		if i >= len(v.configs) { // extra sub-series of the same config: dash them
			line.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
		}
		pts.Color = col
		pts.Shape = glyphs[i%len(glyphs)]
		pts.Radius = vg.Points(3)
		eb, err := plotter.NewYErrorBars(s.pts)
		if err != nil {
			return nil, fmt.Errorf("plot %s error bars: %w", metric, err)
		}
		eb.Color = col
		eb.Width = vg.Points(1)
		c.p.Add(line, pts, eb)
		c.legend = append(c.legend, legendItem{s.name, lineThumb{line, pts}})
	}
	return c, nil
}

// byX sorts a series' points (and their error bars with them) along X.
type byX errPoints

func (b byX) Len() int           { return len(b.XYs) }
func (b byX) Less(i, j int) bool { return b.XYs[i].X < b.XYs[j].X }
func (b byX) Swap(i, j int) {
	b.XYs[i], b.XYs[j] = b.XYs[j], b.XYs[i]
	b.YErrors[i], b.YErrors[j] = b.YErrors[j], b.YErrors[i]
}

// lineThumb shows both the line and its glyph in the legend.
type lineThumb struct {
	l *plotter.Line
	s *plotter.Scatter
}

func (t lineThumb) Thumbnail(c *draw.Canvas) { t.l.Thumbnail(c); t.s.Thumbnail(c) }

// setXTicks puts a tick at every measured X (a sweep has few, meaningful values) and uses a log
// axis when the sweep spans a wide range (64 B..8 KB, 1..80 flows).
func setXTicks(p *plot.Plot, key string, xs []float64) {
	slices.Sort(xs)
	xs = slices.Compact(xs)
	if len(xs) == 0 {
		return
	}
	if xs[0] > 0 && xs[len(xs)-1]/xs[0] >= 8 {
		p.X.Scale = plot.LogScale{}
	}
	ticks := make([]plot.Tick, len(xs))
	for i, x := range xs {
		ticks[i] = plot.Tick{Value: x, Label: xLabel(key, x)}
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	pad := 0.0
	if len(xs) == 1 {
		pad = math.Max(1, xs[0]*0.1)
	}
	if _, isLog := p.X.Scale.(plot.LogScale); isLog {
		p.X.Min, p.X.Max = xs[0]/1.25, xs[len(xs)-1]*1.25
	} else {
		span := xs[len(xs)-1] - xs[0]
		p.X.Min, p.X.Max = xs[0]-span*0.05-pad, xs[len(xs)-1]+span*0.05+pad
	}
}

// xLabel writes sizes the way people say them (64, 1K, 8K).
func xLabel(key string, x float64) string {
	if key == "size" && x >= 1024 && math.Mod(x, 1024) == 0 {
		return fmt.Sprintf("%gK", x/1024)
	}
	return xnum(x)
}

func xTitleShort(key string) string {
	if key == "size" {
		return "message size"
	}
	return key
}

// metricByConfig draws one bar per config (median, min–max bars) for runs without a sweep.
func metricByConfig(v *view, metric string) (*chart, error) {
	var vals plotter.Values
	var errs errPoints
	var names []string
	maxY := 0.0
	for _, pv := range v.points {
		if st, ok := pv.sum[metric]; ok && !math.IsNaN(st.Median) {
			vals = append(vals, st.Median)
			errs.XYs = append(errs.XYs, plotter.XY{X: float64(len(names)), Y: st.Median})
			errs.YErrors = append(errs.YErrors, struct{ Low, High float64 }{st.Median - st.Min, st.Max - st.Median})
			names = append(names, pv.p.Config)
			maxY = max(maxY, st.Max)
		}
	}
	if len(vals) == 0 {
		return nil, nil
	}
	sc := format.For(metric, maxY)
	for i := range vals {
		vals[i] /= sc.Div
		errs.XYs[i].Y /= sc.Div
		errs.YErrors[i].Low /= sc.Div
		errs.YErrors[i].High /= sc.Div
	}
	ylabel := axisLabel(metric, sc)
	c := &chart{p: newPlot(metricTitle(metric)+" by config", "config", ylabel)}
	c.p.Add(hGrid())
	w := min(c.dataWidth()/vg.Length(len(vals)+1)*0.7, vg.Points(110))
	for i := range vals {
		one := make(plotter.Values, len(vals))
		one[i] = vals[i]
		b, err := plotter.NewBarChart(one, w)
		if err != nil {
			return nil, fmt.Errorf("plot %s: %w", metric, err)
		}
		b.Color = colorAt(slices.Index(v.configs, names[i]))
		b.LineStyle.Width = 0
		c.p.Add(b)
	}
	eb, err := plotter.NewYErrorBars(errs)
	if err != nil {
		return nil, fmt.Errorf("plot %s error bars: %w", metric, err)
	}
	eb.Width = vg.Points(1.2)
	c.p.Add(eb)
	c.p.NominalX(names...)
	c.p.Y.Min = 0
	return c, nil
}

// axisLabel is "delivered rate (kpps)"; bare count prefixes are spelled out on an axis.
func axisLabel(metric string, sc format.Scale) string {
	unit := map[string]string{"k": "thousands", "M": "millions", "G": "billions"}[sc.Name]
	if unit == "" {
		unit = sc.Name
	}
	if unit == "" {
		return metricTitle(metric)
	}
	return metricTitle(metric) + " (" + unit + ")"
}
