// Package report turns runs (internal/results) into something people read: an aligned terminal
// table for quick runs, and a self-contained HTML report with PNG plots for everything else.
package report

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/peregrine-net/peregrine/internal/results"
	"github.com/peregrine-net/peregrine/internal/results/format"
)

// xnum formats an X value (a size, a flow count) exactly: 64, 8192, 0.5.
func xnum(x float64) string {
	// Sweep values (sizes up to a 1 MiB file, rates, flows) are whole numbers: never 1.048576e+06.
	if x == float64(int64(x)) && x < 1e15 && x > -1e15 {
		return strconv.FormatInt(int64(x), 10)
	}
	return strconv.FormatFloat(x, 'g', -1, 64)
}

// formatStat renders "median [min–max] unit"; the spread is omitted when there is one value.
func formatStat(metric string, st results.Stat) string {
	s := format.For(metric, math.Max(math.Abs(st.Max), math.Abs(st.Median)))
	med, lo, hi := format.Num(st.Median/s.Div), format.Num(st.Min/s.Div), format.Num(st.Max/s.Div)
	if st.N <= 1 || lo == hi { // a spread below display precision is no spread
		return s.With(med)
	}
	return s.With(fmt.Sprintf("%s [%s–%s]", med, lo, hi))
}

// formatRatio renders "1.72× [1.60–1.85]".
func formatRatio(r results.Ratio) string {
	med, lo, hi := format.Num(r.Median), format.Num(r.Min), format.Num(r.Max)
	if r.N <= 1 || lo == hi {
		return med + "×"
	}
	return fmt.Sprintf("%s× [%s–%s]", med, lo, hi)
}

// changeWord says whether a ratio is an improvement, honest about metrics where less is better.
func changeWord(r results.Ratio) string {
	if math.IsNaN(r.Median) {
		return ""
	}
	pct := (r.Median - 1) * 100
	better := pct > 0
	if results.LowerIsBetter(r.Metric) {
		better = pct < 0
	}
	word := "worse"
	if better {
		word = "better"
	}
	// A spread that straddles 1 is not a measured difference.
	if r.Min <= 1 && r.Max >= 1 && r.N > 1 {
		word = "within noise"
	}
	return fmt.Sprintf("%+.0f%% %s", pct, word)
}

// metricTitle is the human name of a metric for headers and axes ("delivered rate").
func metricTitle(metric string) string {
	if t, ok := titles[metric]; ok {
		return t
	}
	t := metric
	for _, s := range []string{"_bps", "_pps", "_rps", "_us", "_ns", "_bytes", "_frac", "_cores", "_count"} {
		t = strings.TrimSuffix(t, s)
	}
	return strings.ReplaceAll(t, "_", " ")
}

var titles = map[string]string{
	results.MetricThroughput:   "throughput",
	results.MetricDeliveredPPS: "delivered rate",
	results.MetricSentPPS:      "sent rate",
	results.MetricRequests:     "requests",
	results.MetricLatencyAvg:   "latency avg",
	results.MetricLatencyP50:   "latency p50",
	results.MetricLatencyP99:   "latency p99",
	results.MetricLatencyP999:  "latency p99.9",
	results.MetricLoss:         "loss",
	results.MetricCPUBusy:      "receiver CPU",
	results.MetricNetRX:        "NET_RX softirqs",
	results.MetricIRQs:         "IRQs",
	results.MetricRetransmits:  "retransmits",
}

// xTitle names an X key with its unit.
func xTitle(k string) string {
	switch k {
	case "size":
		return "message size (B)"
	case "flows":
		return "flows"
	}
	return k
}
