// Package metrics exports what peregrine sees on a node in the Prometheus format: the kernel's
// receive counters per CPU (softnet_stat, NET_RX/NET_TX softirqs), the datapath attachments and
// whether their knobs still hold, and, optionally, the eBPF stage probe's per-device, per-CPU
// packets and softirq time. Values are gathered while someone scrapes, at most once per refresh
// period by one goroutine, and served from that snapshot (serve.go).
package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/probe"
	"github.com/peregrine-net/peregrine/internal/probe/stage"
)

const ns = "peregrine"

// Collector is a prometheus.Collector over peregrine's probes and records.
type Collector struct {
	stage   *stage.Probe // nil: no per-stage metrics
	devices func() (map[stage.DevKey]stage.DeviceInfo, error)

	softnet, softirq, attached, knobs, knobsHeld, stagePkts, stageNs, scrapeErr *prometheus.Desc
	modePkts, modeEntries                                                       *prometheus.Desc
}

// ModeCounters is a datapath mode that exports its own counters (declared with the mode
// contract: datapath.ModeCounters).
type ModeCounters = datapath.ModeCounters

// New returns a collector; sp may be nil.
func New(sp *stage.Probe) *Collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(ns, "", name), help, labels, nil)
	}
	return &Collector{
		stage:       sp,
		devices:     stage.ResolveDevices,
		softnet:     d("softnet_total", "Per-CPU /proc/net/softnet_stat counters (processed, dropped, time_squeeze, received_rps, flow_limit).", "cpu", "counter"),
		softirq:     d("softirqs_total", "Per-CPU softirq counts from /proc/softirqs.", "cpu", "type"),
		attached:    d("attached", "1 for each datapath attachment on record (mode, target namespace).", "mode", "target", "complete"),
		knobs:       d("knobs", "Knobs an attachment changed.", "mode", "target"),
		knobsHeld:   d("knobs_held", "Knobs of an attachment that still hold the value it set.", "mode", "target"),
		stagePkts:   d("stage_packets_total", "Packets entering the stack per device and CPU (eBPF stage probe; since the probe started).", "netns", "device", "cpu"),
		stageNs:     d("stage_softirq_seconds_total", "NET_RX softirq time attributed per device and CPU (eBPF stage probe).", "netns", "device", "cpu"),
		scrapeErr:   d("scrape_errors", "Sources that failed in this scrape (for a mode: how many of its attachments).", "source"),
		modePkts:    d("mode_packets_total", "Packets a datapath mode's programs handled, by direction and result (e.g. fastpath: hit, miss, fallback reasons).", "mode", "target", "direction", "result"),
		modeEntries: d("mode_table_entries", "Entries in a datapath mode's tables (e.g. fastpath: flows, learned flows, pods).", "mode", "target", "table"),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.softnet, c.softirq, c.attached, c.knobs, c.knobsHeld, c.stagePkts, c.stageNs, c.scrapeErr, c.modePkts, c.modeEntries} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	// A source fails once per target at most (two fastpath attachments whose maps cannot be
	// read): one sample per source, counting them, since a registry refuses the whole scrape
	// when two samples share a name and labels.
	failed := map[string]int{}
	fail := func(src string) { failed[src]++ }
	defer func() { c.failures(ch, failed) }()
	if sn, err := probe.ReadSoftnet(); err == nil {
		for _, p := range sn.PerCPU {
			cpu := strconv.Itoa(p.CPU)
			for name, v := range map[string]uint64{"processed": p.Processed, "dropped": p.Dropped, "time_squeeze": p.TimeSqueeze,
				"received_rps": p.ReceivedRPS, "flow_limit": p.FlowLimitCount} {
				ch <- prometheus.MustNewConstMetric(c.softnet, prometheus.CounterValue, float64(v), cpu, name)
			}
		}
	} else {
		fail("softnet")
	}
	if si, err := probe.ReadSoftirqs(); err == nil {
		for _, typ := range []string{"NET_RX", "NET_TX"} {
			for i, v := range si.Counts[typ] {
				if i < len(si.CPUs) {
					ch <- prometheus.MustNewConstMetric(c.softirq, prometheus.CounterValue, float64(v), strconv.Itoa(si.CPUs[i]), typ)
				}
			}
		}
	} else {
		fail("softirqs")
	}
	if states, err := datapath.AllStates(); err == nil {
		for _, st := range states {
			target := st.Target
			if target == "" {
				target = "host"
			}
			ch <- prometheus.MustNewConstMetric(c.attached, prometheus.GaugeValue, 1, st.Mode, target, strconv.FormatBool(st.Complete))
			held := 0
			for _, k := range st.Knobs {
				if datapath.SameValue(datapath.CurrentValue(k), k.New) {
					held++
				}
			}
			ch <- prometheus.MustNewConstMetric(c.knobs, prometheus.GaugeValue, float64(len(st.Knobs)), st.Mode, target)
			ch <- prometheus.MustNewConstMetric(c.knobsHeld, prometheus.GaugeValue, float64(held), st.Mode, target)
			c.modeCounters(ch, st, target, fail)
		}
	} else {
		fail("datapath")
	}
	if c.stage != nil {
		snap, err := c.stage.Snapshot()
		if err != nil {
			fail("stage")
			return
		}
		if devs, err := c.devices(); err == nil {
			snap.Annotate(devs)
		}
		for _, d := range snap.Devices {
			cpu := strconv.Itoa(d.CPU)
			ch <- prometheus.MustNewConstMetric(c.stagePkts, prometheus.CounterValue, float64(d.Packets), d.NetnsName, d.Name, cpu)
			ch <- prometheus.MustNewConstMetric(c.stageNs, prometheus.CounterValue, float64(d.SoftirqNs)/1e9, d.NetnsName, d.Name, cpu)
		}
	}
}

// modeCounters emits the counters of a mode that has them.
func (c *Collector) modeCounters(ch chan<- prometheus.Metric, st *datapath.State, target string, fail func(string)) {
	m, err := datapath.Lookup(st.Mode)
	if err != nil {
		return
	}
	mc, ok := m.(ModeCounters)
	if !ok {
		return
	}
	pkts, entries, err := mc.Counters(st)
	if err != nil {
		fail(st.Mode)
		return
	}
	for k, v := range pkts {
		ch <- prometheus.MustNewConstMetric(c.modePkts, prometheus.CounterValue, float64(v), st.Mode, target, k[0], k[1])
	}
	for k, v := range entries {
		ch <- prometheus.MustNewConstMetric(c.modeEntries, prometheus.GaugeValue, float64(v), st.Mode, target, k)
	}
}

// failures emits one scrape_errors sample per failed source.
func (c *Collector) failures(ch chan<- prometheus.Metric, failed map[string]int) {
	for src, n := range failed {
		ch <- prometheus.MustNewConstMetric(c.scrapeErr, prometheus.GaugeValue, float64(n), src)
	}
}
