package report

import (
	"strings"
	"testing"

	"github.com/peregrine-net/peregrine/internal/results"
	"github.com/peregrine-net/peregrine/internal/results/resultstest"
)

func TestTable(t *testing.T) {
	size, flows := resultstest.SizeSweep(), resultstest.FlowSweep()
	flows.Complete, flows.Error = false, "interrupted at flows=8"
	var b strings.Builder
	if err := Table(&b, size, flows); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	t.Log("\n" + out)
	for _, want := range []string{
		resultstest.Native, resultstest.Vanilla, resultstest.Falcon,
		"(baseline)", "DELIVERED RATE VS docker/vanilla", "kpps", "Gbps",
		"INCOMPLETE run: interrupted at flows=8", "fixed: flows=1", "sender CPU 1, IRQ CPU 0",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q", want)
		}
	}
	// The ratio figures must be the ones ComputeRatios gives, formatted.
	rs, err := results.ComputeRatios(size, results.MetricDeliveredPPS, resultstest.Vanilla)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if !strings.Contains(out, formatRatio(r)) {
			t.Errorf("table lacks ratio %s for %s at %v", formatRatio(r), r.Numerator, r.X)
		}
	}
}

func TestFormat(t *testing.T) {
	cases := []struct {
		metric string
		st     results.Stat
		want   string
	}{
		{results.MetricThroughput, results.Stat{Median: 9.3e9, Min: 9.1e9, Max: 9.52e9, N: 3}, "9.30 [9.10–9.52] Gbps"},
		{results.MetricDeliveredPPS, results.Stat{Median: 259e3, Min: 259e3, Max: 259e3, N: 1}, "259 kpps"},
		{results.MetricLatencyP99, results.Stat{Median: 25, Min: 24, Max: 500, N: 5}, "25.0 [24.0–500] µs"},
		{results.MetricLatencyP99, results.Stat{Median: 1500, Min: 1200, Max: 2000, N: 5}, "1.50 [1.20–2.00] ms"},
		{results.MetricLoss, results.Stat{Median: 0.125, N: 1}, "12.5%"},
	}
	for _, c := range cases {
		if got := formatStat(c.metric, c.st); got != c.want {
			t.Errorf("formatStat(%s, %+v) = %q, want %q", c.metric, c.st, got, c.want)
		}
	}
	for x, want := range map[float64]string{1048576: "1048576", 64: "64", 0.5: "0.5"} {
		if got := xnum(x); got != want {
			t.Errorf("xnum(%v) = %q, want %q", x, got, want)
		}
	}
	r := results.Ratio{Metric: results.MetricLatencyP99, Median: 0.5, Min: 0.4, Max: 0.6, N: 3}
	if got := changeWord(r); got != "-50% better" {
		t.Errorf("changeWord(latency halved) = %q", got)
	}
	r = results.Ratio{Metric: results.MetricThroughput, Median: 1.05, Min: 0.9, Max: 1.2, N: 3}
	if got := changeWord(r); got != "+5% within noise" {
		t.Errorf("changeWord(straddles 1) = %q", got)
	}
}
