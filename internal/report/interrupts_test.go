package report

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/peregrine-net/peregrine/internal/results"
	"github.com/peregrine-net/peregrine/internal/results/resultstest"
)

// irqFlowRun is the fixture flow sweep (iperf3 TCP, flows up to 8 on a 2-CPU env) with
// interrupt counts in every rep: CAL = 1000 x flows on CPU0, RES 7 per CPU.
func irqFlowRun(t *testing.T) *results.Run {
	t.Helper()
	run := resultstest.FlowSweep()
	run.Env.CPUs = 2
	run.Scenario.Workload = results.WorkloadIperf3TCP
	for i := range run.Points {
		p := &run.Points[i]
		for j := range p.Reps {
			p.Reps[j].SetInterrupts(map[string][]uint64{
				"device": {0, 0}, "cal": {uint64(1000 * p.X["flows"]), 0}, "res": {7, 7}, "loc": {50, 50}})
		}
		results.Summarize(p)
	}
	if len(run.Points) == 0 || run.Points[len(run.Points)-1].X["flows"] < 3 {
		t.Fatalf("fixture flow sweep should reach more flows than CPUs: %+v", run.Points)
	}
	return run
}

func TestInterruptsAndFlowNoteInTable(t *testing.T) {
	run := irqFlowRun(t)
	var b strings.Builder
	if err := Table(&b, run); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	t.Log("\n" + out)
	for _, want := range []string{
		"note: flows share 1 client/server pair (iperf3 -P", "with 2 CPUs",
		"interrupts and softirqs:", "IRQS (ALL)", "CAL IPIS", "RES IPIS", "DEVICE IRQS",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q", want)
		}
	}
	// At 8 flows CAL is 8000 and IRQs (all) 8000 + 14 + 100 = 8114, on every config's row.
	if !strings.Contains(out, "8114") || !strings.Contains(out, "8000") {
		t.Errorf("interrupt block lacks the 8-flow medians 8114 (all) and 8000 (CAL)")
	}
	// A run without interrupt counts prints no interrupt block.
	var b2 strings.Builder
	if err := Table(&b2, resultstest.SizeSweep()); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b2.String(), "interrupts and softirqs") {
		t.Error("interrupt block printed for a run without interrupt counts")
	}
}

func TestInterruptsAndFlowNoteInHTML(t *testing.T) {
	dir := t.TempDir()
	index, err := HTML(dir, []*results.Run{irqFlowRun(t)})
	if err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(index)
	if err != nil {
		t.Fatal(err)
	}
	html := string(page)
	for _, want := range []string{"<h3>Interrupts and softirqs</h3>", "CAL IPIs", "8114",
		"<b>Flows:</b> flows share 1 client/server pair", `src="r1-irqs-count-vs-flows.png"`, `src="r1-irqs-cal-count-vs-flows.png"`} {
		if !strings.Contains(html, want) {
			t.Errorf("index.html lacks %q", want)
		}
	}
	checkPNG(t, filepath.Join(dir, "r1-irqs-count-vs-flows.png"))
}
