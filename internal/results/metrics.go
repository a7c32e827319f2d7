package results

import (
	"strings"
)

// Well-known metric names. A metric's unit is its name's suffix (see UnitOf), so a workload may
// add metrics without touching this package and the report still formats them.
const (
	MetricThroughput   = "throughput_bps" // receiver goodput
	MetricSentBps      = "sent_bps"
	MetricDeliveredPPS = "delivered_pps" // packets (or messages) the receiving application got per second
	MetricSentPPS      = "sent_pps"
	MetricDelivered    = "delivered_packets"
	MetricSent         = "sent_packets"
	MetricRecvBytes    = "received_bytes"
	MetricSentBytes    = "sent_bytes"
	MetricLatencyAvg   = "latency_avg_us"
	MetricLatencyP50   = "latency_p50_us"
	MetricLatencyP99   = "latency_p99_us"
	MetricLatencyP999  = "latency_p999_us"
	MetricRequests     = "requests_rps" // memcached/nginx operations per second
	MetricRetransmits  = "retransmits_count"
	// MetricRetransSegs is the sending namespace's Tcp.RetransSegs over the repetition (the
	// kernel's count, for every TCP workload); MetricDrops the packets dropped on the path: every
	// CPU's backlog (softnet) plus every device of the testbed's namespaces (rx and tx drops).
	// Every benchmark reports both beside its rate (internal/bench/probes).
	MetricRetransSegs = "retransmits_segs_count"
	MetricDrops       = "drops_count"
	MetricLoss        = "loss_frac"      // UDP: 1 - delivered/sent
	MetricCPUBusy     = "cpu_busy_cores" // receiver busy CPU, in cores (1.0 = one core saturated)
	MetricNetRX       = "softirqs_net_rx_count"
	// MetricIRQs is every interrupt /proc/interrupts counted during the repetition, summed over
	// CPUs and rows (device IRQs, IPIs, local timer, ...); IRQMetric names one kind of them.
	MetricIRQs = "irqs_count"
	// MetricOtherCPU is the CPU that processes outside the benchmark (not its own, not its
	// agents, not in its lab's namespaces; kernel threads excluded) used during the repetition,
	// in cores; Rep.Counters holds the largest by name as "other.<comm>".
	MetricOtherCPU = "other_cpu_cores"
)

// IRQKinds are the kinds of Rep.Interrupts, in the order reports show them: device IRQs
// (numbered rows of /proc/interrupts), function-call IPIs (CAL: what RPS uses to kick a remote
// CPU's backlog), rescheduling IPIs (RES: wakeups), TLB shootdowns, the local timer, the rest.
var IRQKinds = []string{"device", "cal", "res", "tlb", "loc", "other"}

// IRQMetric is the metric holding the count of one interrupt kind over a repetition
// ("irqs_cal_count"). Summarize derives it, like irqs_count, from Rep.Interrupts when the rep
// does not report it.
func IRQMetric(kind string) string { return "irqs_" + kind + "_count" }

// SoftirqMetric is the metric holding the total count of one softirq (NET_RX) over a repetition.
// Summarize derives it from Rep.Softirqs when the rep does not report it.
func SoftirqMetric(name string) string {
	return "softirqs_" + strings.ToLower(name) + "_count"
}

// Pairs of metrics where the first can never exceed the second (Validate checks them).
var deliveredSent = [][2]string{
	{MetricDeliveredPPS, MetricSentPPS},
	{MetricDelivered, MetricSent},
	{MetricRecvBytes, MetricSentBytes},
	{MetricThroughput, MetricSentBps},
}

// Unit is how a metric's value is measured.
type Unit string

// Units, from the metric name suffix.
const (
	UnitBitsPerSec  Unit = "bps"   // _bps
	UnitPktsPerSec  Unit = "pps"   // _pps
	UnitReqsPerSec  Unit = "rps"   // _rps
	UnitMicrosecond Unit = "us"    // _us
	UnitNanosecond  Unit = "ns"    // _ns
	UnitBytes       Unit = "bytes" // _bytes
	UnitFraction    Unit = "frac"  // _frac, 0..1
	UnitCores       Unit = "cores" // _cores
	UnitCount       Unit = "count" // _count, _packets and anything unknown
)

var suffixUnits = []struct {
	suffix string
	unit   Unit
}{
	{"_bps", UnitBitsPerSec}, {"_pps", UnitPktsPerSec}, {"_rps", UnitReqsPerSec},
	{"_us", UnitMicrosecond}, {"_ns", UnitNanosecond}, {"_bytes", UnitBytes},
	{"_frac", UnitFraction}, {"_cores", UnitCores},
}

// UnitOf returns the unit a metric name declares by its suffix; UnitCount when none matches.
func UnitOf(metric string) Unit {
	for _, s := range suffixUnits {
		if strings.HasSuffix(metric, s.suffix) {
			return s.unit
		}
	}
	return UnitCount
}

// LowerIsBetter reports whether a smaller value of the metric is the better one (latencies,
// losses, CPU cost, retransmits), so that reports can say "better"/"worse" correctly.
func LowerIsBetter(metric string) bool {
	switch UnitOf(metric) {
	case UnitMicrosecond, UnitNanosecond, UnitFraction, UnitCores:
		return true
	}
	return strings.HasPrefix(metric, "retransmits") || strings.HasPrefix(metric, "drops") ||
		strings.HasPrefix(metric, "fairness_") || strings.HasSuffix(metric, "_s_per_gib")
}
