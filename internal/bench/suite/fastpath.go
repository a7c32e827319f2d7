package suite

import (
	"slices"
	"time"

	"github.com/peregrine-net/peregrine/internal/bench"
	"github.com/peregrine-net/peregrine/internal/results"
)

// The fastpath suites measure what users compare CNIs by (k8s-netperf, knb): one stream as a
// share of the host network, 32 streams, TCP_RR and TCP_CRR latency, CPU per packet, and many
// flows; then score each figure against the node-scale fast path's targets (issue 29). One
// suite per overlay: peregrine's flannel-style lab and real flannel (its own flanneld and CNI).

// Step titles: the scorecard finds a step's run by its title (the run's first note).
const (
	fpTitleTCP   = "TCP throughput, 1 and 32 flows"
	fpTitleRR    = "TCP_RR (ping-pong, 64 B)"
	fpTitleCRR   = "TCP_CRR (connect, request, response, close)"
	fpTitleFlows = "many flows: UDP, 1 and 100 000 concurrent flows"
)

// fastpathSteps returns the steps of a fastpath suite on one style (flannel or real-flannel).
func fastpathSteps(style string) func(quick bool) []Step {
	return func(quick bool) []Step {
		d, reps, warm := 4*time.Second, 5, 1
		if quick {
			d, reps, warm = 2*time.Second, 2, 1
		}
		sc := func(name string) bench.Scenario {
			return bench.Scenario{Name: name, Duration: d, Reps: reps, Warmup: warm}
		}
		cfgs := []string{"native", style, style + "/fastpath"}
		k8s := style == bench.StyleK8s
		if k8s {
			// The cluster's pods have no host-to-host pair to compare with: vanilla (flannel
			// and kube-proxy as they come) is the baseline.
			cfgs = cfgs[1:]
		}
		tcp := sc("tcp")
		tcp.Sizes, tcp.Flows = []int{65536}, []int{1, 32}
		rr := sc("pingpong")
		rr.Sizes, rr.Proto = []int{64}, "tcp"
		crr := sc("crr")
		steps := []Step{
			{fpTitleTCP, tcp, cfgs},
			{fpTitleRR, rr, cfgs},
			{fpTitleCRR, crr, cfgs},
		}
		if !quick && !k8s { // udp-flows needs a lab peregrine built
			// 100 000 flows take a minute to open per rep: the full suite only. No native
			// baseline: the target compares the fast path with itself at 1 flow.
			many := sc("udp-flows")
			many.Sizes, many.Flows, many.Reps = []int{64}, []int{1, 100000}, 3
			steps = append(steps, Step{fpTitleFlows, many, []string{style, style + "/fastpath"}})
		}
		return steps
	}
}

// fastpathTargets are the targets for the suite on one style. Every ratio is the fast
// path's median against vanilla's (the style without a mode) or native, measured in one run with
// interleaved repetitions.
func fastpathTargets(style string) []Target {
	// Configs by the names a run gives them ("flannel/vanilla", not "flannel").
	fp, vanilla := configName(style+"/fastpath"), configName(style)
	one, many := map[string]float64{"flows": 1}, map[string]float64{"flows": 32}
	ts := []Target{
		{Name: "1 flow vs vanilla", Step: fpTitleTCP, Metric: results.MetricThroughput, X: one, Num: fp, Den: vanilla, AtLeast: true, Bound: 1.25},
		{Name: "1 flow vs native", Step: fpTitleTCP, Metric: results.MetricThroughput, X: one, Num: fp, Den: "native", AtLeast: true, Bound: 0.95},
		{Name: "32 flows vs vanilla", Step: fpTitleTCP, Metric: results.MetricThroughput, X: many, Num: fp, Den: vanilla, AtLeast: true, Bound: 1.15},
		{Name: "CPU per packet, 1 flow", Step: fpTitleTCP, Metric: results.MetricCostCPU, X: one, Num: fp, Den: vanilla, Bound: 0.8},
		{Name: "CPU per packet, 32 flows", Step: fpTitleTCP, Metric: results.MetricCostCPU, X: many, Num: fp, Den: vanilla, Bound: 0.8},
		{Name: "TCP_RR p50", Step: fpTitleRR, Metric: results.MetricLatencyP50, Num: fp, Den: vanilla, Bound: 0.75},
		{Name: "TCP_RR p99", Step: fpTitleRR, Metric: results.MetricLatencyP99, Num: fp, Den: vanilla},
		{Name: "TCP_CRR connections/s", Step: fpTitleCRR, Metric: "connections_per_s", Num: fp, Den: vanilla, AtLeast: true, Bound: 1.10},
		{Name: "TCP_CRR p50", Step: fpTitleCRR, Metric: results.MetricLatencyP50, Num: fp, Den: vanilla},
		{Name: "TCP_CRR p99", Step: fpTitleCRR, Metric: results.MetricLatencyP99, Num: fp, Den: vanilla},
		{Name: "100 000 flows vs 1 flow", Step: fpTitleFlows, Metric: results.MetricDeliveredPPS, Num: fp,
			X: map[string]float64{"flows": 100000}, DenX: one, AtLeast: true, Bound: 0.9},
	}
	if style == bench.StyleK8s { // no native baseline, no many-flows step (fastpathSteps)
		ts = slices.DeleteFunc(ts, func(t Target) bool { return t.Den == "native" || t.Step == fpTitleFlows })
	}
	return ts
}

// configName is a config string's name in a run; the string itself if it does not parse (the
// suite's own test catches that).
func configName(s string) string {
	c, err := bench.ParseConfig(s)
	if err != nil {
		return s
	}
	return c.Name()
}
