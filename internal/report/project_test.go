package report

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/results"
)

func TestMinMaxPartition(t *testing.T) {
	for _, c := range []struct {
		xs   []float64
		k    int
		want float64
	}{
		{[]float64{4, 3, 2}, 1, 9},
		{[]float64{4, 3, 2}, 2, 5},  // [4] [3 2]
		{[]float64{4, 3, 2}, 3, 4},  // each alone
		{[]float64{4, 3, 2}, 16, 4}, // more cores than stages
		{[]float64{1, 1, 8}, 2, 8},
	} {
		if got := minMaxPartition(c.xs, c.k); got != c.want {
			t.Errorf("minMaxPartition(%v, %d) = %v, want %v", c.xs, c.k, got, c.want)
		}
	}
}

func TestFlowRateByPlacement(t *testing.T) {
	ns := []float64{4000, 3000, 2000} // nic, vxlan, veth: 9 µs in all
	for _, c := range []struct {
		class         results.Placement
		cores         int
		perFlow, tots float64
	}{
		{results.PlacementOneCore, 1, 1e9 / 9000, 1e9 / 9000},
		{results.PlacementOneCore, 8, 1e9 / 9000, 8e9 / 9000}, // one flow never leaves its core
		{results.PlacementSecondCore, 2, 1e9 / 5000, 2e9 / 9000},
		{results.PlacementStagePerCore, 2, 1e9 / 5000, 2e9 / 9000},
		{results.PlacementStagePerCore, 4, 1e9 / 4000, 4e9 / 9000},
		{results.PlacementSplitAfterNIC, 3, 1e9 / 4000, 3e9 / 9000}, // nic 4000 vs 5000/2
		{results.PlacementUnknown, 8, 1e9 / 9000, 8e9 / 9000},       // modelled as one core
		{"", 8, 1e9 / 9000, 8e9 / 9000},                             // an older file: likewise
		{"warp-drive", 8, 1e9 / 9000, 8e9 / 9000},                   // a class from a newer file
	} {
		pf, tot := flowRate(c.class, ns, c.cores)
		if math.Abs(pf-c.perFlow) > 1e-6 || math.Abs(tot-c.tots) > 1e-6 {
			t.Errorf("%q on %d cores: per flow %.0f total %.0f, want %.0f %.0f", c.class, c.cores, pf, tot, c.perFlow, c.tots)
		}
	}
}

// A synthetic saturated point: CPU0 does all 10 µs of stages per packet at 100 kpps and is full,
// so the model's check predicts exactly the measured rate; a 4-flow point scales with cores.
func TestProjectChecksAgainstMeasured(t *testing.T) {
	rep := func(flows float64) results.Rep {
		return results.Rep{
			Duration: time.Second,
			Metrics:  map[string]float64{results.MetricDelivered: 1e5, results.MetricDeliveredPPS: 1e5},
			CPU:      []results.CPUShare{{CPU: 0, Softirq: 1}, {CPU: 1, User: 0.3, Idle: 0.7}},
			Stages: []results.StageCPU{{Stage: "nic", CPU: 0, Packets: 1e5, SoftirqNs: 0.6e9},
				{Stage: "vxlan", CPU: 0, Packets: 1e5, SoftirqNs: 0.4e9}},
		}
	}
	run := &results.Run{ID: "synthetic", Env: results.Env{CPUs: 2}, Scenario: results.Scenario{Name: "udp-inject"},
		Configs: []results.Config{{Name: "docker/vanilla", Style: "docker", Mode: "vanilla"}},
		Points: []results.Point{{Config: "docker/vanilla", X: map[string]float64{"flows": 1}, Reps: []results.Rep{rep(1)}},
			{Config: "docker/vanilla", X: map[string]float64{"flows": 4}, Reps: []results.Rep{rep(4)}}}}
	pts := projPoints(run)
	if len(pts) != 2 || !pts[0].sat || math.Abs(pts[0].check-1e5) > 1 || pts[0].checkCPU != 0 {
		t.Fatalf("check: %+v, want a saturated point predicted at 100 kpps on cpu0", pts)
	}
	if got := projectRate(pts[0], 8); math.Abs(got-1e5) > 1 {
		t.Errorf("1 flow on 8 cores: %v, want 100 kpps (one flow, one core)", got)
	}
	if got := projectRate(pts[1], 8); math.Abs(got-4e5) > 1 {
		t.Errorf("4 flows on 8 cores: %v, want 400 kpps", got)
	}
	if got := projectRate(pts[1], 2); math.Abs(got-2e5) > 1 {
		t.Errorf("4 flows on 2 cores: %v, want 200 kpps (bounded by the cores)", got)
	}
	var b bytes.Buffer
	if err := Project(&b, []int{1, 8}, run); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"MODEL, not a measurement", "+0%", "median |error| 0%", "PLACEMENT",
		"docker/vanilla: the file records no placement class", "stage-per-core: each stage"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, b.String())
		}
	}
	// The recorded class is what the model uses, with no note.
	run.Configs[0].Placement = results.PlacementSecondCore
	pts = projPoints(run)
	if got := projectRate(pts[0], 8); math.Abs(got-1e9/6000) > 1 {
		t.Errorf("second-core, 1 flow on 8 cores: %v, want 1e9/6000 (the nic stage's 6 µs)", got)
	}
	if n := projectNotes(run); len(n) != 0 {
		t.Errorf("notes for a recorded class: %v", n)
	}
}
