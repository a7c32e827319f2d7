// Package resultstest builds synthetic runs for tests of packages that consume results.
// The numbers are invented (shaped like the characterization study: the overlay halves the
// small-packet rate, a pipelined mode recovers most of it); never report them as measurements.
package resultstest

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/peregrine-net/peregrine/internal/results"
)

// Config names used by the fixtures.
const (
	Native  = "native/host"
	Vanilla = "docker/vanilla"
	Falcon  = "docker/falcon"
)

var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

// base builds the parts every fixture shares.
func base(id string, sc results.Scenario) *results.Run {
	off := func(gro bool) map[string]map[string]bool {
		return map[string]map[string]bool{
			"h2/eth0":      {"generic-receive-offload": gro, "tcp-segmentation-offload": true, "generic-segmentation-offload": true},
			"h2-ov/vxlan0": {"generic-receive-offload": true, "tx-checksumming": true},
		}
	}
	return &results.Run{
		Schema: results.Schema, ID: id, Started: t0, Finished: t0.Add(10 * time.Minute), Complete: true,
		Env: results.Env{Kernel: "6.18.0-fixture", CPUs: 2, CPUModel: "Synthetic CPU @ 2.0GHz",
			Hostname: "fixture", GoVersion: "go1.26", PeregrineVersion: "test", Virtualized: "kvm"},
		Lab: results.Lab{Name: "t", Styles: []string{"docker", "native"}, Hosts: 2, Containers: 1,
			MTU: 1500, Underlay: "direct", RxCPUs: []int{0}},
		Arrangement: results.Arrangement{SenderCPUs: []int{1}, IRQCPUs: []int{0}, StageCPUs: []int{0},
			AppCPUs: []int{1}, Note: "remote-sender emulation"},
		Scenario: sc,
		Configs: []results.Config{
			{Name: Native, Style: "native", Mode: "host", Offloads: off(true)},
			{Name: Vanilla, Style: "docker", Mode: "vanilla", Offloads: off(true)},
			{Name: Falcon, Style: "docker", Mode: "falcon", Offloads: off(true),
				Knobs:       map[string]string{"threshold": "80"},
				Arrangement: &results.Arrangement{SenderCPUs: []int{1}, IRQCPUs: []int{0}, StageCPUs: []int{0, 1}}},
		},
	}
}

// rate gives the invented per-config delivered packet rate at a size (pps).
func rate(config string, size float64) float64 {
	native := 420e3 - 30*size // falls as copies grow
	switch config {
	case Vanilla:
		return native * 0.5
	case Falcon:
		return native * 0.85
	}
	return native
}

// SizeSweep is a UDP packet-rate sweep over message sizes 64 B..8 KB, one flow, three configs,
// three interleaved measured reps plus one warm-up per point, with CPU, softirq and stage data.
func SizeSweep() *results.Run {
	r := base("fixture-size", results.Scenario{Name: "udp-size", Workload: results.WorkloadInjectUDP,
		Params:      map[string]any{"duration_s": 10.0, "sizes": []int{64, 256, 1024, 4096, 8192}},
		Repetitions: 3, Warmup: 1, Interleaved: true,
		Primary: results.MetricDeliveredPPS, Baseline: Vanilla})
	rnd := rand.New(rand.NewPCG(1, 2))
	for _, size := range []float64{64, 256, 1024, 4096, 8192} {
		for _, c := range []string{Native, Vanilla, Falcon} {
			p := results.Point{Config: c, X: map[string]float64{"size": size, "flows": 1}}
			for i := range 4 {
				pps := rate(c, size) * (0.95 + 0.1*rnd.Float64())
				p.Reps = append(p.Reps, rep(c, i, i == 0, size, pps))
			}
			results.Summarize(&p)
			r.Points = append(r.Points, p)
		}
	}
	return r
}

func rep(config string, i int, warm bool, size, pps float64) results.Rep {
	const dur = 10.0
	sent := pps * 1.2
	pkts := uint64(pps * dur)
	rp := results.Rep{Index: i, Warmup: warm, Started: t0.Add(time.Duration(i) * time.Minute),
		Duration: dur * time.Second,
		Metrics: map[string]float64{
			results.MetricDeliveredPPS: pps, results.MetricSentPPS: sent,
			results.MetricThroughput: pps * size * 8, results.MetricLoss: 1 - pps/sent,
		},
		Counters: map[string]float64{"softnet_dropped": 0, "UdpRcvbufErrors": float64(uint64(sent-pps) * 10)},
	}
	// Softirqs: one per stage per batch of ~8 packets; the overlay has three stages.
	stages := map[string][]int{"nic": {0}} // stage -> CPUs it ran on
	switch config {
	case Vanilla:
		stages = map[string][]int{"nic": {0}, "vxlan": {0}, "veth": {0}}
	case Falcon:
		stages = map[string][]int{"nic": {0}, "vxlan": {1}, "veth": {1, 0}}
	}
	netrx := []uint64{0, 0}
	for _, st := range []string{"nic", "vxlan", "veth"} {
		cpus, ok := stages[st]
		if !ok {
			continue
		}
		for j, cpu := range cpus {
			share := 1.0
			if len(cpus) == 2 {
				share = []float64{0.8, 0.2}[j]
			}
			n := uint64(float64(pkts) * share)
			rp.Stages = append(rp.Stages, results.StageCPU{Stage: st, Netns: "prg-t-h2", Device: st + "0",
				CPU: cpu, Packets: n, SoftirqNs: n * 350})
			netrx[cpu] += n / 8
		}
	}
	rp.Softirqs = map[string][]uint64{"NET_RX": netrx, "NET_TX": {pkts / 1000, pkts / 2000}}
	rp.Metrics[results.MetricNetRX] = float64(netrx[0] + netrx[1])
	// CPU: CPU0 takes the IRQ and softirqs; CPU1 runs the app (and the later stages under falcon).
	s0, s1 := 0.95, 0.10
	if config == Falcon {
		s0, s1 = 0.55, 0.45
	} else if config == Native {
		s0 = 0.6
	}
	rp.CPU = []results.CPUShare{
		{CPU: 0, User: 0.01, System: 0.02, IRQ: 0.01, Softirq: s0 - 0.04, Idle: 1 - s0},
		{CPU: 1, User: 0.20, System: 0.25, IRQ: 0, Softirq: s1, Idle: 0.55 - s1},
	}
	rp.Metrics[results.MetricCPUBusy] = rp.CPU[0].Busy() + rp.CPU[1].Busy()
	rp.Raw = []byte(fmt.Sprintf(`{"tool":"fixture","pps":%.0f}`, pps))
	return rp
}

// FlowSweep is a TCP throughput sweep over 1..8 flows at the default size, three configs,
// five interleaved reps, metrics only (no CPU or stage data, to exercise skipped charts).
func FlowSweep() *results.Run {
	r := base("fixture-flows", results.Scenario{Name: "tcp-flows", Workload: results.WorkloadIperf3TCP,
		Params: map[string]any{"duration_s": 10.0}, Repetitions: 5, Interleaved: true,
		Primary: results.MetricThroughput, Baseline: Vanilla})
	rnd := rand.New(rand.NewPCG(3, 4))
	for _, flows := range []float64{1, 2, 4, 8} {
		for _, c := range []string{Native, Vanilla, Falcon} {
			gbps := map[string]float64{Native: 23, Vanilla: 6.4, Falcon: 11}[c]
			gbps *= min(flows, 2) * 0.8 // two cores: scaling stops at two
			p := results.Point{Config: c, X: map[string]float64{"flows": flows}}
			for i := range 5 {
				v := gbps * 1e9 * (0.93 + 0.14*rnd.Float64())
				p.Reps = append(p.Reps, results.Rep{Index: i, Started: t0, Duration: 10 * time.Second,
					Metrics: map[string]float64{results.MetricThroughput: v, results.MetricRetransmits: float64(rnd.IntN(50))}})
			}
			results.Summarize(&p)
			r.Points = append(r.Points, p)
		}
	}
	return r
}
