package results

import (
	"math"
	"strings"
	"testing"
	"time"
)

// syntheticRep is a 2-second UDP rep on 2 CPUs whose every cost figure is known by hand.
func syntheticRep() Rep {
	return Rep{
		Duration: 2 * time.Second,
		Metrics:  map[string]float64{MetricDelivered: 1e6, MetricSent: 1.1e6},
		CPU: []CPUShare{
			{CPU: 0, System: 0.1, Softirq: 0.8, Idle: 0.1}, // busy 0.9
			{CPU: 1, User: 0.2, System: 0.3, Idle: 0.5},    // busy 0.5
		},
		NetRxNs: []uint64{1.6e9, 0.2e9},
		Stages: []StageCPU{
			{Stage: "nic", CPU: 0, Packets: 1e6, SoftirqNs: 0.6e9},
			{Stage: "vxlan", CPU: 0, Packets: 1e6, SoftirqNs: 0.5e9},
			{Stage: "veth", CPU: 0, Packets: 1e6, SoftirqNs: 0.4e9},
			{Stage: "nic", CPU: 1, Packets: 0, SoftirqNs: 0.1e9},
		},
		SenderCPUNs: 0.55e9,
		Programs: []ProgramRuns{
			{Name: "prg_cost_calib", ID: 9, Role: RoleCalibration, Runs: 1e6, RunNs: 80e6},
			{Name: "prg_falcon_nic", ID: 10, Role: RoleDatapath, Runs: 5e5, RunNs: 150e6}, // host 1
			{Name: "prg_falcon_nic", ID: 20, Role: RoleDatapath, Runs: 5e5, RunNs: 150e6}, // host 2
			{Name: "prg_falcon_port", ID: 11, Role: RoleDatapath, Runs: 2e6, RunNs: 400e6},
			{Name: "prg_stage_rcv", ID: 30, Role: RoleProbe, Runs: 3e6, RunNs: 300e6},
			{Name: "prg_idle", ID: 31, Role: RoleDatapath},
		},
	}
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

func TestRepCostsArithmetic(t *testing.T) {
	r := syntheticRep()
	m := RepCosts(&r, CostInput{Style: "docker", MTU: 1500, IRQCPUs: []int{0}})
	want := map[string]float64{
		MetricCostCPU:                        2800, // (0.9+0.5) * 2 s / 1e6
		MetricCostIRQCPU:                     1800, // 0.9 * 2 s / 1e6
		MetricCostReceive:                    1600, // 1.6 s of NET_RX charged to the path's stages / 1e6
		StageCostMetric("nic"):               700,  // both CPUs' NIC time
		StageCostMetric("vxlan"):             500,
		StageCostMetric("veth"):              400,
		MetricCostUnattributed:               200,  // 1.8 s NET_RX - 1.6 s in stages
		MetricCostOther:                      1000, // 2.8 s busy - 1.8 s NET_RX
		MetricCostSender:                     500,  // 0.55 s / 1.1e6 sent
		MetricBPFCalibration:                 80,
		ProgramRunMetric("prg_falcon_nic"):   220, // 300 gross - 80
		ProgramRunsMetric("prg_falcon_nic"):  1,
		ProgramRunMetric("prg_falcon_port"):  120, // 200 - 80
		ProgramRunsMetric("prg_falcon_port"): 2,
		ProgramRunMetric("prg_stage_rcv"):    20,
		MetricCostBPF:                        460, // 1*220 + 2*120; the probe is not the datapath
	}
	for k, v := range want {
		if got, ok := m[k]; !ok || !near(got, v) {
			t.Errorf("%s = %v (present %v), want %v", k, got, ok, v)
		}
	}
	if _, ok := m[ProgramRunMetric("prg_idle")]; ok {
		t.Errorf("a program that never ran got a per-run cost")
	}
	if _, ok := m[MetricCPUPerGbps]; ok {
		t.Errorf("cores per Gbps without a throughput")
	}
	// The stacked chart's parts add up to the whole.
	sum := m[StageCostMetric("nic")] + m[StageCostMetric("vxlan")] + m[StageCostMetric("veth")] + m[MetricCostUnattributed] + m[MetricCostOther]
	if !near(sum, m[MetricCostCPU]) {
		t.Errorf("stages+unattributed+other = %v, want cost_cpu_ns %v", sum, m[MetricCostCPU])
	}
}

func TestRepCostsWithoutCalibrationHasNoNetFigures(t *testing.T) {
	r := syntheticRep()
	r.Programs = r.Programs[1:]
	m := RepCosts(&r, CostInput{IRQCPUs: []int{0}})
	if !near(m[MetricCostReceive], 1600) {
		t.Errorf("receive %v", m[MetricCostReceive])
	}
	r.Stages = nil // no stage probe: all NET_RX time
	if m := RepCosts(&r, CostInput{}); !near(m[MetricCostReceive], 1800) {
		t.Errorf("receive without stages %v, want 1800", m[MetricCostReceive])
	}
	for k := range m {
		if strings.HasPrefix(k, "bpf_") || k == MetricCostBPF {
			t.Errorf("%s computed without a calibration program", k)
		}
	}
}

func TestDeliveredPacketsTCPEstimate(t *testing.T) {
	r := Rep{Duration: time.Second, Metrics: map[string]float64{MetricThroughput: 10e9}}
	pk, how := DeliveredPackets(&r, CostInput{Style: "docker", MTU: 1500})
	if !near(pk, 10e9/8/1398) || !strings.Contains(how, "TCP") {
		t.Errorf("docker: %v (%s), want %v", pk, how, 10e9/8/1398)
	}
	pk, _ = DeliveredPackets(&r, CostInput{Style: "native", MTU: 1500})
	if !near(pk, 10e9/8/1448) {
		t.Errorf("native: %v, want %v", pk, 10e9/8/1448)
	}
	r.CPU = []CPUShare{{CPU: 0, Softirq: 1}, {CPU: 1, Softirq: 0.5, Idle: 0.5}}
	m := RepCosts(&r, CostInput{Style: "native", MTU: 1500})
	if !near(m[MetricCPUPerGbps], 0.15) { // 1.5 cores / 10 Gbps
		t.Errorf("cpu_per_gbps_cores = %v, want 0.15", m[MetricCPUPerGbps])
	}
	if got := RepCosts(&Rep{Duration: time.Second}, CostInput{}); got != nil {
		t.Errorf("a rep that delivered nothing has costs %v", got)
	}
}

func TestComputeCostsReplacesStaleAndSummarizes(t *testing.T) {
	r := syntheticRep()
	r.Metrics["cost_cpu_ns"] = 1 // stale derived value: recomputed
	r.Metrics["cost_stage_gone_ns"] = 5
	run := &Run{Schema: Schema, Lab: Lab{MTU: 1500}, Arrangement: Arrangement{IRQCPUs: []int{1}},
		Configs: []Config{{Name: "docker/falcon", Style: "docker", Mode: "falcon"}},
		Points:  []Point{{Config: "docker/falcon", X: map[string]float64{"size": 64}, Reps: []Rep{r}}}}
	run.ComputeCosts()
	got := run.Points[0].Reps[0].Metrics
	if !near(got[MetricCostCPU], 2800) || !near(got[MetricCostIRQCPU], 1000) {
		t.Errorf("cost_cpu_ns %v (want 2800), cost_irq_cpu_ns %v (want 1000 on CPU1)", got[MetricCostCPU], got[MetricCostIRQCPU])
	}
	if _, ok := got["cost_stage_gone_ns"]; ok {
		t.Errorf("stale derived metric kept")
	}
	if got[MetricDelivered] != 1e6 {
		t.Errorf("measured metric changed: %v", got[MetricDelivered])
	}
}

func TestDecodeUpgradesV1(t *testing.T) {
	doc := `{"schema":"peregrine.run/v1","id":"x","started":"2025-01-02T03:04:05Z","complete":false,
	 "env":{"kernel":"6","cpus":2},"lab":{"styles":["docker"],"hosts":2,"containers":1,"mtu":1500,"underlay":"direct"},
	 "scenario":{"name":"udp-inject","workload":"inject-udp","repetitions":1,"warmup":0,"interleaved":true},
	 "arrangement":{"irq_cpus":[0]},"configs":[{"name":"docker/vanilla","style":"docker","mode":"vanilla"}],
	 "points":[{"config":"docker/vanilla","x":{"size":64},"reps":[{"index":0,"started":"2025-01-02T03:04:05Z",
	  "duration_ns":1000000000,"metrics":{"delivered_packets":1000},
	  "cpu":[{"cpu":0,"user":0,"system":0,"irq":0,"softirq":0.5,"idle":0.5}]}]}]}`
	r, err := Decode([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if r.Schema != Schema {
		t.Errorf("schema %q after upgrade, want %q", r.Schema, Schema)
	}
	st, ok := r.Points[0].Summary[MetricCostCPU]
	if !ok || !near(st.Median, 0.5e9/1000) {
		t.Errorf("derived cost_cpu_ns summary %+v (present %v), want 500000", st, ok)
	}
	if _, err := Decode([]byte(`{"schema":"peregrine.run/v3"}`)); err == nil || !strings.Contains(err.Error(), "newer") {
		t.Errorf("v3: %v, want a newer-version error", err)
	}
}
