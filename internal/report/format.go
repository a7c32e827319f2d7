// Package report turns runs (internal/results) into something people read: an aligned terminal
// table for quick runs, and a self-contained HTML report with PNG plots for everything else.
package report

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/peregrine-net/peregrine/internal/results"
)

// scale is a display unit: values are divided by Div and suffixed with Name.
type scale struct {
	Div  float64
	Name string
}

// scaleFor picks a human unit for a metric from a representative magnitude (the largest value
// shown), so one column or one axis uses one unit throughout.
func scaleFor(metric string, mag float64) scale {
	mag = math.Abs(mag)
	switch results.UnitOf(metric) {
	case results.UnitBitsPerSec:
		return pick(mag, scale{1e9, "Gbps"}, scale{1e6, "Mbps"}, scale{1e3, "kbps"}, scale{1, "bps"})
	case results.UnitPktsPerSec:
		return pick(mag, scale{1e6, "Mpps"}, scale{1e3, "kpps"}, scale{1, "pps"})
	case results.UnitReqsPerSec:
		return pick(mag, scale{1e6, "Mreq/s"}, scale{1e3, "kreq/s"}, scale{1, "req/s"})
	case results.UnitMicrosecond:
		return pick(mag, scale{1e6, "s"}, scale{1e3, "ms"}, scale{1, "µs"})
	case results.UnitNanosecond:
		return pick(mag, scale{1e6, "ms"}, scale{1e3, "µs"}, scale{1, "ns"})
	case results.UnitBytes:
		return pick(mag, scale{1 << 30, "GiB"}, scale{1 << 20, "MiB"}, scale{1 << 10, "KiB"}, scale{1, "B"})
	case results.UnitFraction:
		return scale{0.01, "%"}
	case results.UnitCores:
		return scale{1, "cores"}
	}
	return pick(mag, scale{1e9, "G"}, scale{1e6, "M"}, scale{1e3, "k"}, scale{1, ""})
}

// pick returns the first scale (largest first) whose divisor the magnitude reaches.
func pick(mag float64, ss ...scale) scale {
	for _, s := range ss {
		if mag >= s.Div {
			return s
		}
	}
	return ss[len(ss)-1]
}

// num formats a scaled value with three significant digits, which is all the precision a noisy
// benchmark has.
func num(v float64) string {
	switch {
	case math.IsNaN(v):
		return "n/a"
	case v == 0:
		return "0"
	case math.Abs(v) >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case math.Abs(v) >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

// xnum formats an X value (a size, a flow count) exactly: 64, 8192, 0.5.
func xnum(x float64) string {
	// Sweep values (sizes up to a 1 MiB file, rates, flows) are whole numbers: never 1.048576e+06.
	if x == float64(int64(x)) && x < 1e15 && x > -1e15 {
		return strconv.FormatInt(int64(x), 10)
	}
	return strconv.FormatFloat(x, 'g', -1, 64)
}

// withUnit joins a number and a unit name ("12.3 Gbps", "45%", "3.2k").
func withUnit(v string, s scale) string {
	switch s.Name {
	case "":
		return v
	case "%", "k", "M", "G":
		return v + s.Name
	}
	return v + " " + s.Name
}

// formatStat renders "median [min–max] unit"; the spread is omitted when there is one value.
func formatStat(metric string, st results.Stat) string {
	s := scaleFor(metric, math.Max(math.Abs(st.Max), math.Abs(st.Median)))
	med, lo, hi := num(st.Median/s.Div), num(st.Min/s.Div), num(st.Max/s.Div)
	if st.N <= 1 || lo == hi { // a spread below display precision is no spread
		return withUnit(med, s)
	}
	return withUnit(fmt.Sprintf("%s [%s–%s]", med, lo, hi), s)
}

// formatRatio renders "1.72× [1.60–1.85]".
func formatRatio(r results.Ratio) string {
	med, lo, hi := num(r.Median), num(r.Min), num(r.Max)
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

// FormatValue renders one measured value with a human unit ("12.3 Gbps", "412 kpps").
func FormatValue(metric string, v float64) string {
	s := scaleFor(metric, v)
	return withUnit(num(v/s.Div), s)
}
