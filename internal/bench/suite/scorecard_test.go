package suite

import (
	"bytes"
	"strings"
	"testing"

	"github.com/peregrine-net/peregrine/internal/results"
)

// fakeRun is a run of one step with interleaved reps: vals[config][x] are the reps' values of
// metric at flows x.
func fakeRun(title, metric string, vals map[string]map[float64][]float64) *results.Run {
	r := &results.Run{Notes: []string{title}}
	r.Scenario.Interleaved = true
	for cfg, byX := range vals {
		for x, vs := range byX {
			p := results.Point{Config: cfg, X: map[string]float64{"flows": x, "size": 65536}}
			for i, v := range vs {
				p.Reps = append(p.Reps, results.Rep{Index: i, Metrics: map[string]float64{metric: v}})
			}
			r.Points = append(r.Points, p)
		}
	}
	return r
}

func TestScorecardJudgesEachTarget(t *testing.T) {
	tcp := fakeRun(fpTitleTCP, results.MetricThroughput, map[string]map[float64][]float64{
		"native":           {1: {10, 10, 10}, 32: {10, 10, 10}},
		"flannel/vanilla":  {1: {8, 8, 8}, 32: {5, 5, 5}},
		"flannel/fastpath": {1: {9.6, 9.7, 9.8}, 32: {5.5, 5.5, 5.5}},
	})
	flows := fakeRun(fpTitleFlows, results.MetricDeliveredPPS, map[string]map[float64][]float64{
		"flannel/fastpath": {1: {100, 100}, 100000: {95, 93}},
		"flannel/vanilla":  {1: {80, 80}, 100000: {40, 40}},
	})
	scores := Scorecard(fastpathTargets("flannel"), []*results.Run{tcp, flows})
	by := map[string]Score{}
	for _, s := range scores {
		by[s.Name] = s
	}
	check := func(name string, median float64, met *bool, reason bool) {
		t.Helper()
		s, ok := by[name]
		if !ok {
			t.Fatalf("no score %q", name)
		}
		if reason != (s.Reason != "") {
			t.Fatalf("%s: reason %q", name, s.Reason)
		}
		if !reason && (s.Median < median-0.001 || s.Median > median+0.001) {
			t.Errorf("%s: median %.3f, want %.3f", name, s.Median, median)
		}
		if (met == nil) != (s.Met == nil) || (met != nil && *met != *s.Met) {
			t.Errorf("%s: met %v, want %v", name, s.Met, met)
		}
	}
	yes, no := true, false
	check("1 flow vs vanilla", 9.7/8, &no, false)       // 1.21 < 1.25
	check("1 flow vs native", 0.97, &yes, false)        // >= 0.95
	check("32 flows vs vanilla", 1.1, &no, false)       // < 1.15
	check("TCP_RR p50", 0, nil, true)                   // step not run
	check("CPU per packet, 1 flow", 0, nil, true)       // no such metric in the run
	check("100 000 flows vs 1 flow", 0.94, &yes, false) // 94/100 >= 0.9
	if s := by["1 flow vs native"]; s.Min > s.Median || s.Max < s.Median || s.Target != ">= 0.95" {
		t.Errorf("1 flow vs native: range %.3f–%.3f around %.3f, target %q", s.Min, s.Max, s.Median, s.Target)
	}
	var b bytes.Buffer
	if err := WriteScorecard(&b, scores); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"1 flow vs vanilla", "1.21×", "step not run", "2 of 4 targets met"} {
		if !strings.Contains(out, want) {
			t.Errorf("scorecard table lacks %q:\n%s", want, out)
		}
	}
}

func TestFastpathSuitesHaveTargetsOnTheirSteps(t *testing.T) {
	for _, name := range []string{"fastpath", "fastpath-real", "fastpath-k8s"} {
		titles := map[string]bool{}
		for _, st := range suites[name].steps(false) {
			titles[st.Title] = true
		}
		ts := Targets(name)
		if len(ts) == 0 {
			t.Fatalf("suite %s has no targets", name)
		}
		for _, tg := range ts {
			if !titles[tg.Step] {
				t.Errorf("suite %s: target %q scores step %q, which the suite does not run", name, tg.Name, tg.Step)
			}
		}
	}
	for _, tg := range Targets("fastpath-k8s") {
		if tg.Den == "native" {
			t.Errorf("fastpath-k8s scores %q against native, which the k8s lab does not have", tg.Name)
		}
	}
	if Targets("falcon") != nil {
		t.Errorf("falcon has no targets")
	}
}
