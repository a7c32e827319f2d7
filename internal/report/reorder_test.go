package report

import (
	"os"
	"strings"
	"testing"

	"github.com/peregrine-net/peregrine/internal/results"
	"github.com/peregrine-net/peregrine/internal/results/resultstest"
)

// TestReorderingBlock: the block shows the medians of the reordering counters, only the columns
// some point has non-zero, skips warm-up reps, and is absent for a run that reordered nothing.
func TestReorderingBlock(t *testing.T) {
	run := resultstest.FlowSweep()
	for i := range run.Points {
		p := &run.Points[i]
		for j := range p.Reps {
			r := &p.Reps[j]
			if r.Counters == nil {
				r.Counters = map[string]float64{}
			}
			r.Counters["receiver.TcpExt.TCPOFOQueue"] = 100*float64(i+1) + float64(j)
			r.Counters["sender.TcpExt.TCPSpuriousRTOs"] = 0
			if r.Warmup {
				r.Counters["receiver.TcpExt.TCPOFOQueue"] = 999999
			}
		}
		results.Summarize(p)
	}
	var b strings.Builder
	if err := Table(&b, run); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if !strings.Contains(out, "reordering:") || !strings.Contains(out, "OFO QUEUED (RX)") {
		t.Fatalf("no reordering block:\n%s", out)
	}
	if strings.Contains(out, "SPURIOUS RTOS") {
		t.Error("an all-zero column is shown")
	}
	if strings.Contains(out, "999999") {
		t.Error("a warm-up rep counted")
	}
	// Point 0's measured reps hold 100 + rep index: the median is in 100..109.
	block := out[strings.Index(out, "reordering:"):]
	if !strings.Contains(block, "\n"+run.Points[0].Config) {
		t.Errorf("block lacks point 0's row:\n%s", block)
	}

	dir := t.TempDir()
	index, err := HTML(dir, []*results.Run{run})
	if err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(index)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(page), "<h3>Reordering</h3>") {
		t.Error("HTML report lacks the reordering block")
	}

	var b2 strings.Builder
	if err := Table(&b2, resultstest.SizeSweep()); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b2.String(), "reordering:") {
		t.Error("reordering block printed for a run without reordering counters")
	}
}
