package pdbench

import (
	"strings"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/report"
	"github.com/peregrine-net/peregrine/internal/results"
)

// TestPDRuns: a pd bench report becomes valid result files, one per test, with ratios against
// kernel TCP, that the report renders; a failed point makes its run incomplete, not invalid.
func TestPDRuns(t *testing.T) {
	rep := &PDReport{Kernel: "6.18", CPUs: 2, Points: []PDPoint{
		{Test: "throughput", Transport: "tcp", Size: 65536, Gbps: 10, AppCPU: 0.5, TotalCPU: 1.2},
		{Test: "throughput", Transport: "pd-engine", Size: 65536, Gbps: 25, AppCPU: 0.2, TotalCPU: 0.6},
		{Test: "throughput", Transport: "tcp", Size: 64, Gbps: 0.5, AppCPU: 5, TotalCPU: 9},
		{Test: "throughput", Transport: "pd-engine", Size: 64, Err: "daemon gone"},
		{Test: "latency", Transport: "tcp", Size: 64, P50us: 20, P99us: 40},
		{Test: "latency", Transport: "pd-direct", Size: 64, P50us: 5, P99us: 9},
		{Test: "scale", Transport: "tcp", Conns: 128, Gbps: 8, TotalCPU: 1.5},
		{Test: "fairness", Transport: "pd-engine", Conns: 16, FairCV: 0.05, Gbps: 20},
	}}
	t0 := time.Date(2026, 11, 24, 1, 0, 0, 0, time.UTC)
	runs := PDRuns(rep, PDOptions{}, t0, t0.Add(time.Minute), "test")
	if len(runs) != 4 {
		t.Fatalf("%d runs, want 4 (throughput, latency, scale, fairness)", len(runs))
	}
	byName := map[string]*results.Run{}
	for _, r := range runs {
		byName[r.Scenario.Name] = r
		if errs := r.Validate(); len(errs) > 0 {
			t.Errorf("%s: invalid: %v", r.Scenario.Name, errs)
		}
	}
	tp := byName["pd-throughput"]
	if tp == nil || tp.Complete {
		t.Fatalf("throughput run %+v: want it present and incomplete (a point failed)", tp)
	}
	found := false
	for _, r := range tp.Ratios {
		if r.Numerator == "pd-engine" && r.Denominator == "tcp" && r.X["size"] == 65536 {
			found = true
			if r.Median < 2.49 || r.Median > 2.51 {
				t.Errorf("pd-engine/tcp at 64 KiB = %v, want 2.5", r.Median)
			}
		}
	}
	if !found {
		t.Errorf("no pd-engine/tcp ratio at 64 KiB: %+v", tp.Ratios)
	}
	if fr := byName["pd-fairness"]; fr == nil || fr.Scenario.Baseline != "pd-engine" {
		t.Errorf("a test without tcp compares against its first transport: %+v", fr)
	}
	var b strings.Builder
	if err := report.Table(&b, byName["pd-latency"]); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "pd-direct") {
		t.Errorf("latency table lacks pd-direct:\n%s", b.String())
	}
	if _, err := report.HTML(t.TempDir(), runs); err != nil {
		t.Errorf("HTML report: %v", err)
	}
}
