package results

import (
	"slices"
	"sort"
	"strings"
)

// Cost metrics: CPU time per delivered packet, derived from a rep's probes by ComputeCosts. On a
// 2-CPU machine throughput mostly says which process shares a core with which; the cost of a
// packet in nanoseconds survives the move to a bigger machine (DESIGN.md, "Measuring").
const (
	// MetricCostCPU is all CPUs' busy time per delivered packet: the whole machine, the
	// emulated remote sender included.
	MetricCostCPU = "cost_cpu_ns"
	// MetricCostReceive is the NET_RX softirq time the stage probe charged to the measured
	// receive path's devices (every CPU, every stage, the emulated NIC's poll included) per
	// delivered packet: the kernel's receive path, and only ours (other traffic on a shared
	// machine is not in it). Without stage rows it falls back to all NET_RX time. The overlay
	// tax is this figure's ratio overlay/native.
	MetricCostReceive = "cost_receive_ns"
	// MetricCostIRQCPU is the busy time of the IRQ CPUs (Arrangement.IRQCPUs) per delivered packet.
	MetricCostIRQCPU = "cost_irq_cpu_ns"
	// MetricCostSender is the sending thread's CPU time per packet sent (injector only).
	MetricCostSender = "cost_sender_ns"
	// MetricCostUnattributed is NET_RX time the stage probe could charge to no stage, per packet.
	MetricCostUnattributed = "cost_unattributed_ns"
	// MetricCostOther is busy time outside NET_RX (syscalls, the application, the sender,
	// other softirqs), per delivered packet. Stages + unattributed + other = cost_cpu_ns.
	MetricCostOther = "cost_other_ns"
	// MetricCostBPF is the net run time of the datapath's eBPF programs per delivered packet
	// (runs per packet × net ns per run, summed); it is part of the stages' time.
	MetricCostBPF = "cost_bpf_ns"
	// MetricCostProbe is the stage probe's own net run time per delivered packet: the price of
	// per-stage attribution, paid inside the stages' time (--no-stage-probe removes it).
	MetricCostProbe = "cost_probe_ns"
	// MetricCPUPerGbps is busy cores per delivered Gbps (= CPU seconds per delivered gigabit).
	MetricCPUPerGbps = "cpu_per_gbps_cores"
	// MetricBPFCalibration is the calibration program's gross ns per run: what the statistics
	// and one more program's dispatch cost, netted out of every program's figure.
	MetricBPFCalibration = "bpf_calibration_run_ns"
)

// StageCostMetric is the metric of one stage's NET_RX time per delivered packet.
func StageCostMetric(stage string) string { return "cost_stage_" + metricSafe(stage) + "_ns" }

// ProgramRunMetric is a program's net ns per run (gross minus the calibration program's).
func ProgramRunMetric(name string) string { return "bpf_" + metricSafe(name) + "_run_ns" }

// ProgramRunsMetric is how many times a program ran per delivered packet.
func ProgramRunsMetric(name string) string { return "bpf_" + metricSafe(name) + "_runs_per_packet" }

func metricSafe(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' {
			return r
		}
		if r >= 'A' && r <= 'Z' {
			return r + 'a' - 'A'
		}
		return '_'
	}, s)
}

// IsCostMetric reports whether ComputeCosts derives the metric (so it is recomputed, not kept).
func IsCostMetric(m string) bool {
	return strings.HasPrefix(m, "cost_") || strings.HasPrefix(m, "bpf_") || m == MetricCPUPerGbps
}

// CostInput is what ComputeCosts needs besides the rep: the config's style and the lab's MTU
// (to count TCP segments) and the CPUs of the emulated NIC IRQ.
type CostInput struct {
	Style   string
	MTU     int
	IRQCPUs []int
}

// DeliveredPackets is the packet count costs are divided by: the receiver's count when the
// workload has one (UDP), else delivered_pps × duration, else for a byte stream (TCP) the
// goodput in wire-sized segments (MTU − 52 bytes of IP/TCP headers with timestamps, − 50 more
// for an overlay's VXLAN encapsulation). The second result says which.
func DeliveredPackets(r *Rep, in CostInput) (float64, string) {
	if v, ok := r.Metrics[MetricDelivered]; ok && v > 0 {
		return v, "delivered_packets"
	}
	secs := r.Duration.Seconds()
	if v, ok := r.Metrics[MetricDeliveredPPS]; ok && v > 0 && secs > 0 {
		return v * secs, "delivered_pps x duration"
	}
	if v, ok := r.Metrics[MetricThroughput]; ok && v > 0 && secs > 0 {
		mtu := in.MTU
		if mtu <= 0 {
			mtu = 1500
		}
		mss := mtu - 52
		if in.Style != "native" && in.Style != "" {
			mss -= 50
		}
		return v * secs / 8 / float64(mss), "TCP segments estimated from goodput"
	}
	return 0, ""
}

// RepCosts derives the cost metrics of one rep from its CPU shares, NET_RX time, stage
// attribution, sender CPU time and eBPF program statistics. It returns nil when the rep
// delivered nothing countable or has no duration.
func RepCosts(r *Rep, in CostInput) map[string]float64 {
	pk, _ := DeliveredPackets(r, in)
	durNs := float64(r.Duration.Nanoseconds())
	if pk <= 0 || durNs <= 0 {
		return nil
	}
	m := map[string]float64{}
	busyNs := 0.0
	irqNs, haveIRQ := 0.0, false
	for _, c := range r.CPU {
		b := c.Busy() * durNs
		busyNs += b
		if slices.Contains(in.IRQCPUs, c.CPU) {
			irqNs += b
			haveIRQ = true
		}
	}
	if len(r.CPU) > 0 {
		m[MetricCostCPU] = busyNs / pk
		if haveIRQ {
			m[MetricCostIRQCPU] = irqNs / pk
		}
		if bps, ok := r.Metrics[MetricThroughput]; ok && bps > 0 {
			m[MetricCPUPerGbps] = busyNs / durNs / (bps / 1e9)
		}
	}
	if sent := r.Metrics[MetricSent]; r.SenderCPUNs > 0 && sent > 0 {
		m[MetricCostSender] = float64(r.SenderCPUNs) / sent
	}

	stageNs := map[string]float64{}
	stageSum := 0.0
	for _, s := range r.Stages {
		stageNs[s.Stage] += float64(s.SoftirqNs)
		stageSum += float64(s.SoftirqNs)
	}
	for st, ns := range stageNs {
		m[StageCostMetric(st)] = ns / pk
	}
	netRx := float64(sumU64(r.NetRxNs))
	switch {
	case len(r.Stages) > 0:
		m[MetricCostReceive] = stageSum / pk
	case len(r.NetRxNs) > 0:
		m[MetricCostReceive] = netRx / pk
	}
	if len(r.NetRxNs) > 0 {
		m[MetricCostUnattributed] = max(0, netRx-stageSum) / pk
		if len(r.CPU) > 0 {
			m[MetricCostOther] = max(0, busyNs-max(netRx, stageSum)) / pk
		}
	}

	progCosts(r, pk, m)
	return m
}

// progCosts adds each program's net ns per run and runs per packet, aggregated by name (one
// mode loads its programs once per host), and the datapath's total per packet.
func progCosts(r *Rep, pk float64, m map[string]float64) {
	calib := -1.0
	type agg struct {
		runs, ns float64
		role     string
	}
	byName := map[string]*agg{}
	var names []string
	for _, p := range r.Programs {
		if p.Role == RoleCalibration {
			if p.Runs > 0 {
				calib = float64(p.RunNs) / float64(p.Runs)
			}
			continue
		}
		a := byName[p.Name]
		if a == nil {
			a = &agg{role: p.Role}
			byName[p.Name] = a
			names = append(names, p.Name)
		}
		a.runs += float64(p.Runs)
		a.ns += float64(p.RunNs)
	}
	if calib < 0 {
		return // without the calibration program, a net figure would be a guess
	}
	m[MetricBPFCalibration] = calib
	sort.Strings(names)
	total, haveDP, probe, haveProbe := 0.0, false, 0.0, false
	for _, n := range names {
		a := byName[n]
		if a.runs == 0 {
			continue
		}
		net := a.ns/a.runs - calib
		m[ProgramRunMetric(n)] = net
		m[ProgramRunsMetric(n)] = a.runs / pk
		switch a.role {
		case RoleDatapath:
			total += a.runs * max(0, net)
			haveDP = true
		case RoleProbe:
			probe += a.runs * max(0, net)
			haveProbe = true
		}
	}
	if haveDP {
		m[MetricCostBPF] = total / pk
	}
	if haveProbe {
		m[MetricCostProbe] = probe / pk
	}
}

// ComputeCosts derives every rep's cost metrics in place (replacing earlier derived ones), so
// summaries, ratios and the report treat them like any measured metric.
func (run *Run) ComputeCosts() {
	style := map[string]string{}
	irq := map[string][]int{}
	for _, c := range run.Configs {
		style[c.Name] = c.Style
		irq[c.Name] = run.Arrangement.IRQCPUs
		if c.Arrangement != nil && len(c.Arrangement.IRQCPUs) > 0 {
			irq[c.Name] = c.Arrangement.IRQCPUs
		}
	}
	for i := range run.Points {
		p := &run.Points[i]
		in := CostInput{Style: style[p.Config], MTU: run.Lab.MTU, IRQCPUs: irq[p.Config]}
		for j := range p.Reps {
			r := &p.Reps[j]
			for k := range r.Metrics {
				if IsCostMetric(k) {
					delete(r.Metrics, k)
				}
			}
			c := RepCosts(r, in)
			if len(c) == 0 {
				continue
			}
			if r.Metrics == nil {
				r.Metrics = map[string]float64{}
			}
			for k, v := range c {
				r.Metrics[k] = v
			}
		}
	}
}
