// Package pdbench is PipeDevice's benchmark (`peregrine pd bench`): kernel TCP, the sockmap
// shortcut and PipeDevice's two modes between two containers of a lab, and its result files in
// the bench schema (internal/results).
package pdbench

import (
	"fmt"
	"time"

	"github.com/peregrine-net/peregrine/internal/bench"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/results"
)

// Metrics of the PipeDevice results that the iperf/sockperf scenarios do not have.
const (
	MetricPDAppCPU   = "app_cpu_s_per_gib"         // client + server processes (application and library)
	MetricPDTotalCPU = "total_cpu_s_per_gib"       // the whole machine: + kernel softirqs, + the daemon's engine
	MetricPDRTTP50   = "rtt_p50_us"                // round trip, not halved (pd perf --latency)
	MetricPDRTTP99   = "rtt_p99_us"                //
	MetricPDFairness = "fairness_stddev_over_mean" // of the client processes' throughputs
)

// WorkloadPDPerf is `peregrine pd perf` between two containers of one host.
const WorkloadPDPerf = "pd-perf"

// PDRuns turns a pd bench report into result files of the bench schema, one per test
// (throughput by size, round trips by size, many connections, fairness), each comparing the
// transports against kernel TCP, so `peregrine report` tables and plots them like any run.
// Each point was measured once (pd bench runs no repetitions): min = median = max.
func PDRuns(rep *PDReport, o PDOptions, started, finished time.Time, version string) []*results.Run {
	o.defaults()
	type test struct {
		name, title, primary string
		x                    func(p PDPoint) map[string]float64
		metrics              func(p PDPoint) map[string]float64
	}
	tests := []test{
		{"throughput", "pd-throughput", results.MetricThroughput,
			func(p PDPoint) map[string]float64 { return map[string]float64{"size": float64(p.Size)} },
			func(p PDPoint) map[string]float64 {
				return map[string]float64{results.MetricThroughput: p.Gbps * 1e9, MetricPDAppCPU: p.AppCPU, MetricPDTotalCPU: p.TotalCPU}
			}},
		{"latency", "pd-latency", MetricPDRTTP50,
			func(p PDPoint) map[string]float64 { return map[string]float64{"size": float64(p.Size)} },
			func(p PDPoint) map[string]float64 {
				return map[string]float64{MetricPDRTTP50: p.P50us, MetricPDRTTP99: p.P99us}
			}},
		{"scale", "pd-scale", results.MetricThroughput,
			func(p PDPoint) map[string]float64 { return map[string]float64{"conns": float64(p.Conns)} },
			func(p PDPoint) map[string]float64 {
				return map[string]float64{results.MetricThroughput: p.Gbps * 1e9, MetricPDTotalCPU: p.TotalCPU}
			}},
		{"fairness", "pd-fairness", MetricPDFairness,
			func(p PDPoint) map[string]float64 { return map[string]float64{"conns": float64(p.Conns)} },
			func(p PDPoint) map[string]float64 {
				return map[string]float64{MetricPDFairness: p.FairCV, results.MetricThroughput: p.Gbps * 1e9}
			}},
	}
	var runs []*results.Run
	for _, t := range tests {
		run := &results.Run{
			Schema: results.Schema, ID: fmt.Sprintf("%s-%s", t.title, started.Format("20060102-150405")),
			Started: started, Finished: finished, Complete: true,
			Env: bench.Environment(version),
			Lab: results.Lab{Name: o.Lab, Styles: []string{lab.StyleDocker}, Hosts: 2, Containers: 2, MTU: 1500, Underlay: lab.UnderlayDirect},
			Scenario: results.Scenario{Name: t.title, Workload: WorkloadPDPerf, Repetitions: 1, Primary: t.primary, Baseline: "tcp",
				Params: map[string]any{"duration_s": o.Duration.Seconds(), "latency_count": o.LatCount, "engine_cpus": o.EngineCPUs}},
			Arrangement: results.Arrangement{Note: "two containers of one host (h1-c1 client, h1-c2 server); pd bench runs each point once"},
		}
		declared := map[string]bool{}
		for _, p := range rep.Points {
			if p.Test != t.name {
				continue
			}
			if !declared[p.Transport] {
				declared[p.Transport] = true
				run.Configs = append(run.Configs, results.Config{Name: p.Transport, Style: lab.StyleDocker, Mode: p.Transport})
			}
			r := results.Rep{Index: 0, Started: started, Metrics: t.metrics(p), Error: p.Err}
			if p.Err != "" {
				run.Complete = false
				r.Metrics = map[string]float64{}
			}
			pt := results.Point{Config: p.Transport, X: t.x(p), Reps: []results.Rep{r}}
			run.Points = append(run.Points, pt)
		}
		if len(run.Points) == 0 {
			continue
		}
		run.SummarizeAll()
		if !declared["tcp"] {
			run.Scenario.Baseline = run.Configs[0].Name
		}
		if rs, err := results.ComputeRatios(run, t.primary, run.Scenario.Baseline); err == nil {
			run.Ratios = rs
		}
		runs = append(runs, run)
	}
	return runs
}
