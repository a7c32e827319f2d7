package results_test

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/results"
	"github.com/peregrine-net/peregrine/internal/results/resultstest"
)

// point builds a test point whose reps carry one metric m with the given values; warm marks
// indices that are warm-ups, failed indices that carry an error.
func point(config string, m string, vals []float64, warm, failed map[int]bool) results.Point {
	p := results.Point{Config: config, X: map[string]float64{"size": 64}}
	for i, v := range vals {
		r := results.Rep{Index: i, Warmup: warm[i], Metrics: map[string]float64{m: v}}
		if failed[i] {
			r.Error = "tool crashed"
		}
		p.Reps = append(p.Reps, r)
	}
	return p
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestSummarizeSkipsWarmupAndFailed(t *testing.T) {
	// 1000 is a warm-up and 5 a failed rep: neither may count.
	p := point("a", "x_pps", []float64{1000, 3, 1, 5, 2, 4}, map[int]bool{0: true}, map[int]bool{3: true})
	results.Summarize(&p)
	got := p.Summary["x_pps"]
	want := results.Stat{Median: 2.5, Min: 1, Max: 4, N: 4}
	if got != want {
		t.Fatalf("summary = %+v, want %+v", got, want)
	}
}

func TestSummarizeOddMedianAndDerivedSoftirqs(t *testing.T) {
	p := results.Point{Config: "a"}
	for i, vec := range [][]uint64{{10, 5}, {1, 1}, {100, 0}} {
		p.Reps = append(p.Reps, results.Rep{Index: i, Metrics: map[string]float64{"m_us": float64(i * 10)},
			Softirqs: map[string][]uint64{"NET_RX": vec}})
	}
	results.Summarize(&p)
	if s := p.Summary["m_us"]; s.Median != 10 || s.N != 3 {
		t.Errorf("m_us = %+v, want median 10 over 3", s)
	}
	// Per-CPU vectors sum to 15, 2, 100 -> median 15.
	if s := p.Summary[results.MetricNetRX]; s.Median != 15 || s.Min != 2 || s.Max != 100 {
		t.Errorf("%s = %+v, want median 15 min 2 max 100", results.MetricNetRX, s)
	}
}

func ratioRun(interleaved bool) *results.Run {
	r := &results.Run{Schema: results.Schema, Scenario: results.Scenario{Interleaved: interleaved},
		Configs: []results.Config{{Name: "base"}, {Name: "new"}}}
	// Paired reps: ratios 2, 1.5, 3 -> min 1.5 max 3. Medians: new 12, base 6 -> 2.
	r.Points = append(r.Points,
		point("base", "t_bps", []float64{5, 8, 4}, nil, nil),
		point("new", "t_bps", []float64{10, 12, 12}, nil, nil))
	return r
}

func TestComputeRatiosPaired(t *testing.T) {
	rs, err := results.ComputeRatios(ratioRun(true), "t_bps", "base")
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 {
		t.Fatalf("got %d ratios, want 1 (the denominator is not compared with itself)", len(rs))
	}
	r := rs[0]
	// medians: new {10,12,12} -> 12; base {5,8,4} -> 5; ratio 2.4
	if !near(r.Median, 12.0/5) || !near(r.Min, 1.5) || !near(r.Max, 3) || r.N != 3 || r.Spread != results.SpreadPairs {
		t.Errorf("ratio = %+v, want median 2.4, pairs min 1.5 max 3 n 3", r)
	}
	if r.Numerator != "new" || r.Denominator != "base" || r.X["size"] != 64 {
		t.Errorf("ratio names/x = %+v", r)
	}
}

func TestComputeRatiosBounds(t *testing.T) {
	rs, err := results.ComputeRatios(ratioRun(false), "t_bps", "base")
	if err != nil {
		t.Fatal(err)
	}
	r := rs[0]
	// not interleaved: min = 10/8, max = 12/4
	if !near(r.Min, 10.0/8) || !near(r.Max, 3) || r.Spread != results.SpreadBounds {
		t.Errorf("ratio = %+v, want bounds 1.25..3", r)
	}
}

func TestComputeRatiosErrors(t *testing.T) {
	if _, err := results.ComputeRatios(ratioRun(true), "t_bps", "nope"); err == nil ||
		!strings.Contains(err.Error(), "nope") {
		t.Errorf("unknown denominator: err = %v", err)
	}
	if _, err := results.ComputeRatios(ratioRun(true), "missing_pps", "base"); err == nil {
		t.Error("missing metric: no error")
	}
}

func TestComputeRatiosFixture(t *testing.T) {
	run := resultstest.SizeSweep()
	rs, err := results.ComputeRatios(run, results.MetricDeliveredPPS, resultstest.Vanilla)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 10 { // 5 sizes x 2 other configs
		t.Fatalf("got %d ratios, want 10", len(rs))
	}
	for _, r := range rs {
		want := map[string]float64{resultstest.Native: 2, resultstest.Falcon: 1.7}[r.Numerator]
		if math.Abs(r.Median-want) > 0.25 || r.Min > r.Median || r.Max < r.Median {
			t.Errorf("%s/%s at %v = %+v, want about %.1f with min<=median<=max", r.Numerator, r.Denominator, r.X, r, want)
		}
	}
}

func TestFixturesValidate(t *testing.T) {
	for _, run := range []*results.Run{resultstest.SizeSweep(), resultstest.FlowSweep()} {
		if errs := run.Validate(); len(errs) > 0 {
			t.Errorf("%s: %v", run.ID, errs)
		}
	}
}

func TestValidateFindsEveryProblem(t *testing.T) {
	run := resultstest.SizeSweep()
	rep := &run.Points[1].Reps[2]
	rep.Metrics[results.MetricDeliveredPPS] = rep.Metrics[results.MetricSentPPS] * 2
	rep.CPU[0].Idle += 0.3
	rep.Metrics[results.MetricNetRX]++
	rep.Stages[0].CPU = 7
	run.Points[2].Config = "ghost/mode"
	run.Points = append(run.Points, run.Points[0]) // duplicate point
	run.Complete, run.Error = true, "boom"
	errs := run.Validate()
	want := []string{
		"delivered_pps", "exceeds sent_pps",
		"cpu 0: shares sum to 1.300",
		"differs from the per-CPU sum",
		"cpu 7 outside 0..1",
		`config "ghost/mode" is not declared`,
		"same config and x as points[0]",
		"complete run carries an error",
	}
	all := ""
	for _, e := range errs {
		all += e.Error() + "\n"
	}
	for _, w := range want {
		if !strings.Contains(all, w) {
			t.Errorf("Validate missed %q; got:\n%s", w, all)
		}
	}
	if !strings.Contains(all, "points[1] (docker/vanilla flows=1,size=64) rep 2") {
		t.Errorf("errors do not say where:\n%s", all)
	}
}

func TestWriteReadRoundTrip(t *testing.T) {
	run := resultstest.SizeSweep()
	rs, _ := results.ComputeRatios(run, results.MetricDeliveredPPS, resultstest.Vanilla)
	run.Ratios = rs
	path := filepath.Join(t.TempDir(), "run.json")
	if err := run.Write(path); err != nil {
		t.Fatal(err)
	}
	got, err := results.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != run.ID || !got.Started.Equal(run.Started) || len(got.Points) != len(run.Points) ||
		len(got.Ratios) != len(run.Ratios) || got.Configs[2].Arrangement == nil {
		t.Fatalf("round trip lost data: %+v", got)
	}
	gp, wp := got.Points[4], run.Points[4]
	if gp.Reps[1].Metrics[results.MetricDeliveredPPS] != wp.Reps[1].Metrics[results.MetricDeliveredPPS] ||
		gp.Reps[1].Duration != 10*time.Second || gp.Summary[results.MetricDeliveredPPS] != wp.Summary[results.MetricDeliveredPPS] ||
		len(gp.Reps[1].Stages) != len(wp.Reps[1].Stages) || compact(gp.Reps[1].Raw) != compact(wp.Reps[1].Raw) ||
		got.Configs[0].Offloads["h2/eth0"]["generic-receive-offload"] != true {
		t.Errorf("round trip changed point 4")
	}
	if errs := got.Validate(); len(errs) > 0 {
		t.Errorf("read-back run invalid: %v", errs)
	}
	// snake_case keys on disk.
	data, _ := os.ReadFile(path)
	for _, k := range []string{`"softirq_ns"`, `"duration_ns"`, `"cpu_model"`, `"rx_cpus"`, `"sender_cpus"`} {
		if !strings.Contains(string(data), k) {
			t.Errorf("file lacks key %s", k)
		}
	}
}

// compact drops the indentation Write adds inside raw tool output.
func compact(b []byte) string {
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return "invalid: " + err.Error()
	}
	return buf.String()
}

func TestReadRejectsOtherSchemas(t *testing.T) {
	dir := t.TempDir()
	cases := map[string]string{
		`{"schema":"peregrine.run/v3","id":"x"}`: "newer",
		`{"schema":"peregrine.run/v0"}`:          "older",
		`{"schema":"something/else"}`:            "not a peregrine run",
		`{"id":"x"}`:                             `no "schema" field`,
		`[1,2]`:                                  "not a JSON object",
	}
	for doc, want := range cases {
		path := filepath.Join(dir, "f.json")
		if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := results.Read(path)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Read(%s) err = %v, want it to mention %q", doc, err, want)
		}
	}
}

func TestUnitOf(t *testing.T) {
	for m, u := range map[string]results.Unit{
		"throughput_bps": results.UnitBitsPerSec, "latency_p99_us": results.UnitMicrosecond,
		"delivered_pps": results.UnitPktsPerSec, "retransmits_count": results.UnitCount, "odd": results.UnitCount,
	} {
		if got := results.UnitOf(m); got != u {
			t.Errorf("UnitOf(%s) = %s, want %s", m, got, u)
		}
	}
	if !results.LowerIsBetter("latency_p99_us") || results.LowerIsBetter("throughput_bps") {
		t.Error("LowerIsBetter wrong")
	}
}

func TestComputeRatiosZeroDenominator(t *testing.T) {
	r := &results.Run{Schema: results.Schema, Scenario: results.Scenario{Interleaved: true},
		Configs: []results.Config{{Name: "base"}, {Name: "new"}}}
	r.Points = append(r.Points,
		point("base", "drops_count", []float64{0, 0, 0}, nil, nil),
		point("new", "drops_count", []float64{1, 2, 3}, nil, nil))
	rs, err := results.ComputeRatios(r, "drops_count", "base")
	if err != nil || len(rs) != 0 {
		t.Fatalf("ratios against zero = %+v, %v; want none and no error", rs, err)
	}
	r.Ratios = rs
	if err := r.Write(filepath.Join(t.TempDir(), "z.json")); err != nil {
		t.Fatal(err)
	}
}

func TestInterruptsFillAndDerive(t *testing.T) {
	var rep results.Rep
	rep.SetInterrupts(map[string][]uint64{"device": {0, 0}, "cal": {300, 20}, "res": {5, 7}, "loc": {100, 100}})
	want := map[string]float64{results.MetricIRQs: 532, results.IRQMetric("cal"): 320, results.IRQMetric("res"): 12,
		results.IRQMetric("device"): 0, results.IRQMetric("loc"): 200}
	for m, v := range want {
		if got := rep.Metrics[m]; got != v {
			t.Errorf("%s = %g, want %g", m, got, v)
		}
	}
	// A file that has only the per-CPU vectors still summarizes irqs_count (derived).
	p := results.Point{Config: "a"}
	for i, cal := range []uint64{10, 30, 20} {
		p.Reps = append(p.Reps, results.Rep{Index: i, Metrics: map[string]float64{},
			Interrupts: map[string][]uint64{"cal": {cal, 0}, "res": {1, 1}}})
	}
	results.Summarize(&p)
	if s := p.Summary[results.MetricIRQs]; s.Median != 22 || s.Min != 12 || s.Max != 32 || s.N != 3 {
		t.Errorf("derived %s = %+v, want median 22 min 12 max 32", results.MetricIRQs, s)
	}
	if s := p.Summary[results.IRQMetric("cal")]; s.Median != 20 {
		t.Errorf("derived irqs_cal_count = %+v, want median 20", s)
	}
	// Validate catches a total that disagrees with its vectors.
	run := &results.Run{Schema: results.Schema, Env: results.Env{CPUs: 2}, Configs: []results.Config{{Name: "a"}},
		Points: []results.Point{{Config: "a", X: map[string]float64{"size": 1}, Reps: []results.Rep{rep}}}}
	run.Points[0].Reps[0].Metrics[results.MetricIRQs] = 1
	found := false
	for _, e := range run.Validate() {
		if strings.Contains(e.Error(), results.MetricIRQs) {
			found = true
		}
	}
	if !found {
		t.Errorf("Validate should flag irqs_count 1 against vectors summing to 532: %v", run.Validate())
	}
}

func TestFlowSharingNote(t *testing.T) {
	run := &results.Run{Schema: results.Schema, Env: results.Env{CPUs: 2},
		Scenario: results.Scenario{Workload: results.WorkloadIperf3TCP}}
	for _, f := range []float64{1, 80} {
		run.Points = append(run.Points, results.Point{Config: "a", X: map[string]float64{"flows": f}})
	}
	n := results.FlowSharingNote(run)
	if !strings.Contains(n, "1 client/server pair") || !strings.Contains(n, "iperf3 -P") || !strings.Contains(n, "2 CPUs") {
		t.Fatalf("note %q should say the flows share 1 pair via iperf3 -P on 2 CPUs", n)
	}
	run.SummarizeAll()
	run.SummarizeAll()
	count := 0
	for _, x := range run.Notes {
		if x == n {
			count++
		}
	}
	if count != 1 {
		t.Fatalf("the note should be recorded exactly once, notes %q", run.Notes)
	}
	single := &results.Run{Points: []results.Point{{Config: "a", X: map[string]float64{"flows": 1}}}}
	if results.FlowSharingNote(single) != "" {
		t.Fatal("a one-flow run needs no note")
	}
}
