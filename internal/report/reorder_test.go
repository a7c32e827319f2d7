package report

import (
	"os"
	"slices"
	"strconv"
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
			// Measured reps 1..4 hold 100(i+1)+j: median 100(i+1)+2.5; rep 0 is a warm-up.
			r.Counters["receiver.TcpExt.TCPOFOQueue"] = 100*float64(i+1) + float64(j)
			r.Counters["sender.TcpExt.TCPSpuriousRTOs"] = 0
			if j == 0 {
				r.Warmup = true
				r.Counters["receiver.TcpExt.TCPOFOQueue"] = 999999
			}
		}
		results.Summarize(p)
	}
	tb := reorderTable(newView(run), xTitle)
	col := slices.Index(tb.Head, "OFO queued (rx)")
	if col < 0 || len(tb.Rows) != len(run.Points) {
		t.Fatalf("reordering table %+v", tb)
	}
	for _, row := range tb.Rows {
		v, err := strconv.ParseFloat(row[col], 64)
		if err != nil || int(v)%100 != 2 || v < 102 || v > 100*float64(len(run.Points))+2 {
			t.Errorf("row %v: OFO median %q, want 100k+2 (the median of the measured reps, warm-up left out)", row, row[col])
		}
	}
	var b strings.Builder
	if err := Table(&b, run); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if !strings.Contains(out, "reordering and loss:") || !strings.Contains(out, "OFO QUEUED (RX)") {
		t.Fatalf("no reordering block:\n%s", out)
	}
	if strings.Contains(out, "SPURIOUS RTOS") {
		t.Error("an all-zero column is shown")
	}
	if strings.Contains(out, "999999") {
		t.Error("a warm-up rep counted")
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
	if !strings.Contains(string(page), "<h3>Reordering and loss</h3>") {
		t.Error("HTML report lacks the reordering block")
	}

	var b2 strings.Builder
	if err := Table(&b2, resultstest.SizeSweep()); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b2.String(), "reordering and loss:") {
		t.Error("reordering block printed for a run without reordering counters")
	}
}
