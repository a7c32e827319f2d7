package bench

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/peregrine-net/peregrine/internal/bpfstats"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/results"
	"github.com/peregrine-net/peregrine/internal/testutil"
)

// watchStats wraps the statistics switch of o so a test sees every Enable and whether it was
// closed.
func watchStats(t *testing.T, o *Options, onEnable func()) *int {
	t.Helper()
	enabled := new(int)
	o.enableStats = func() (*bpfstats.Switch, error) {
		sw, err := bpfstats.Enable()
		if err == nil {
			*enabled++
			if n, _ := bpfstats.OpenStatsFDs(); sw.How == "fd" && n != 1 {
				t.Errorf("%d BPF stats descriptors open during the run, want 1", n)
			}
			if onEnable != nil {
				onEnable()
			}
		}
		return sw, err
	}
	return enabled
}

// assertStatsRestored: no statistics descriptor of ours is left open and the sysctl reads
// what it read before the run.
func assertStatsRestored(t *testing.T, sysctlBefore string) {
	t.Helper()
	if n, err := bpfstats.OpenStatsFDs(); err != nil || n != 0 {
		t.Errorf("%d BPF stats descriptors still open after the run (%v)", n, err)
	}
	if v, _ := bpfstats.SysctlValue(); v != sysctlBefore {
		t.Errorf("kernel.bpf_stats_enabled = %s after the run, was %s", v, sysctlBefore)
	}
}

func TestBPFStatsRestoredAfterRunWithCosts(t *testing.T) {
	testutil.RequireRoot(t)
	before, err := bpfstats.SysctlValue()
	if err != nil {
		t.Fatal(err)
	}
	o := shortOptions(t, "udp-inject")
	enabled := watchStats(t, &o, nil)
	o.Configs = []Config{{Style: lab.StyleNative, Mode: ModeVanilla}, {Style: lab.StyleDocker, Mode: ModeVanilla}}
	run, _, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if *enabled != 1 {
		t.Fatalf("statistics enabled %d times, want once for the run", *enabled)
	}
	assertStatsRestored(t, before)
	testutil.AssertClean(t, fmt.Sprintf("prg-b%dx", os.Getpid()%100000))
	for _, p := range run.Points {
		m := p.Reps[0].Metrics
		for _, want := range []string{results.MetricCostCPU, results.MetricCostReceive, results.MetricBPFCalibration, results.MetricCostProbe} {
			if m[want] <= 0 {
				t.Errorf("%s: %s = %v, want > 0", p.Config, want, m[want])
			}
		}
		var calib bool
		for _, pr := range p.Reps[0].Programs {
			calib = calib || pr.Role == results.RoleCalibration && pr.Runs > 0
		}
		if !calib {
			t.Errorf("%s: the calibration program never ran: %+v", p.Config, p.Reps[0].Programs)
		}
		if _, ok := p.Summary[results.MetricCostReceive]; !ok {
			t.Errorf("%s: no summary of %s", p.Config, results.MetricCostReceive)
		}
	}
	// The overlay's receive cost is charged to its extra stages (the VXLAN device, the container
	// veth), which the native path does not have. (Which path costs more per delivered packet is
	// a benchmark's question: flat out, dropped frames' work blurs it.)
	if run.Points[1].Config != "docker/vanilla" {
		t.Fatalf("second point is %s, want docker/vanilla", run.Points[1].Config)
	}
	for _, stage := range []string{"vxlan", "veth"} {
		m := results.StageCostMetric(stage)
		if run.Points[1].Reps[0].Metrics[m] <= 0 {
			t.Errorf("docker: %s = %v, want > 0", m, run.Points[1].Reps[0].Metrics[m])
		}
		if v, ok := run.Points[0].Reps[0].Metrics[m]; ok && v > 0 {
			t.Errorf("native: %s = %v, want none (no such stage)", m, v)
		}
	}
}

func TestBPFStatsRestoredAfterFailedRun(t *testing.T) {
	testutil.RequireRoot(t)
	before, err := bpfstats.SysctlValue()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	o := shortOptions(t, "udp-inject")
	enabled := watchStats(t, &o, cancel) // the run is interrupted right after the switch went on
	o.Configs = o.Configs[:1]
	run, _, err := Run(ctx, o)
	if err == nil || !strings.Contains(err.Error(), "interrupted") {
		t.Fatalf("want an interrupted run, got %v", err)
	}
	if *enabled != 1 || run == nil || run.Complete {
		t.Fatalf("enabled %d times, run %v", *enabled, run)
	}
	assertStatsRestored(t, before)
	testutil.AssertClean(t, fmt.Sprintf("prg-b%dx", os.Getpid()%100000))
}
