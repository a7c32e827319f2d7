package results_test

import (
	"strings"
	"testing"

	"github.com/peregrine-net/peregrine/internal/results"
)

// twoMetricRun: configs base and new, each with throughput (the primary) and latency.
func twoMetricRun() *results.Run {
	r := &results.Run{Schema: results.Schema, Scenario: results.Scenario{Interleaved: true, Primary: results.MetricThroughput, Baseline: "base"},
		Configs: []results.Config{{Name: "base"}, {Name: "new"}}}
	for _, c := range []struct {
		name     string
		tput, us []float64
	}{{"base", []float64{5, 8, 4}, []float64{10, 10, 10}}, {"new", []float64{10, 12, 12}, []float64{20, 30, 40}}} {
		p := results.Point{Config: c.name, X: map[string]float64{"size": 64}}
		for i := range c.tput {
			p.Reps = append(p.Reps, results.Rep{Index: i, Metrics: map[string]float64{results.MetricThroughput: c.tput[i], results.MetricLatencyP99: c.us[i]}})
		}
		r.Points = append(r.Points, p)
	}
	return r
}

// Derive stores summaries and the primary's ratios (the cost ratios only where measured);
// Figures adds the other main metrics' ratios for display without writing them to the run.
func TestDeriveThenFigures(t *testing.T) {
	run := twoMetricRun()
	run.Derive()
	if run.Points[1].Summary[results.MetricThroughput].Median != 12 {
		t.Fatalf("summary not stored: %+v", run.Points[1].Summary)
	}
	if len(run.Ratios) != 1 || run.Ratios[0].Metric != results.MetricThroughput || !near(run.Ratios[0].Median, 12.0/5) {
		t.Fatalf("stored ratios %+v, want the primary's only (no cost metrics measured)", run.Ratios)
	}
	f := results.FiguresOf(run)
	if f.Primary != results.MetricThroughput || f.Baseline != "base" || len(f.Metrics) != 2 || f.Metrics[1] != results.MetricLatencyP99 {
		t.Fatalf("figures %+v", f)
	}
	r, ok := f.Ratio(results.MetricLatencyP99, &run.Points[1])
	if !ok || !near(r.Median, 3) {
		t.Fatalf("latency ratio %+v %v, want 3", r, ok)
	}
	if len(run.Ratios) != 1 {
		t.Fatal("Figures wrote to the run")
	}
	if _, ok := f.Ratio(results.MetricThroughput, &run.Points[0]); ok {
		t.Error("the baseline has a ratio against itself")
	}
}

// A file's own figures win over recomputing (a report never contradicts the file); a file
// without summaries is summarized on a copy.
func TestFiguresTakeTheFilesOwn(t *testing.T) {
	run := twoMetricRun()
	run.Ratios = []results.Ratio{{Metric: results.MetricThroughput, Numerator: "new", Denominator: "base", X: map[string]float64{"size": 64}, Median: 7}}
	f := results.FiguresOf(run)
	if r, _ := f.Ratio(results.MetricThroughput, &run.Points[1]); r.Median != 7 {
		t.Errorf("stored ratio replaced: %+v", r)
	}
	if s := f.Summary(&run.Points[0]); s[results.MetricThroughput].Median != 5 {
		t.Errorf("summary of an unsummarized file: %+v", s)
	}
	if run.Points[0].Summary != nil {
		t.Error("FiguresOf summarized the run itself")
	}
	run.Scenario = results.Scenario{} // no primary, no baseline: the first main metric, the stored ratios' denominator
	if f := results.FiguresOf(run); f.Primary != results.MetricThroughput || f.Baseline != "base" {
		t.Errorf("fallbacks: primary %q baseline %q", f.Primary, f.Baseline)
	}
}

func TestMedianOver(t *testing.T) {
	p := point("a", "x_count", []float64{1, 9, 4, 100}, map[int]bool{3: true}, nil)
	m, ok := p.MedianOver(func(r *results.Rep) (float64, bool) { v, ok := r.Metrics["x_count"]; return v, ok })
	if !ok || m != 4 {
		t.Errorf("median %v %v, want 4 (the warm-up left out)", m, ok)
	}
	if _, ok := p.MedianOver(func(*results.Rep) (float64, bool) { return 0, false }); ok {
		t.Error("a median of nothing")
	}
}

func TestStackPlacement(t *testing.T) {
	for _, c := range []struct {
		in   []results.Placement
		want results.Placement
	}{
		{nil, results.PlacementOneCore},
		{[]results.Placement{results.PlacementStagePerCore, results.PlacementOneCore}, results.PlacementStagePerCore},
		{[]results.Placement{results.PlacementStagePerCore, results.PlacementSplitAfterNIC}, results.PlacementSplitAfterNIC},
		{[]results.Placement{results.PlacementSecondCore, results.PlacementUnknown}, results.PlacementUnknown},
		{[]results.Placement{"made-up"}, results.PlacementUnknown},
	} {
		if got := results.StackPlacement(c.in...); got != c.want {
			t.Errorf("StackPlacement(%v) = %s, want %s", c.in, got, c.want)
		}
	}
	run := twoMetricRun()
	run.Schema = results.Schema
	run.Configs[1].Placement = "made-up"
	found := false
	for _, e := range run.Validate() {
		found = found || strings.Contains(e.Error(), `unknown placement class "made-up"`)
	}
	if !found {
		t.Errorf("Validate accepts an unknown placement class: %v", run.Validate())
	}
}
