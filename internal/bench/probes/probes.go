// Package probes samples what happens on the machine around each repetition of a benchmark:
// per-CPU time, softirqs, interrupts, softnet and nstat counters (internal/probe), the eBPF
// stage probe's per-stage attribution, the eBPF programs' run-time statistics net of a
// calibration program, and the other processes' CPU. A probe that cannot run is left out with
// a note; the measurement goes on.
package probes

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/peregrine-net/peregrine/internal/bench/testbed"
	"github.com/peregrine-net/peregrine/internal/bpfstats"
	"github.com/peregrine-net/peregrine/internal/probe"
	"github.com/peregrine-net/peregrine/internal/probe/stage"
	"github.com/peregrine-net/peregrine/internal/results"
)

// Options choose the probes of a run.
type Options struct {
	NoStageProbe bool // no eBPF stage probe (no per-stage attribution)
	NoBPFStats   bool // the kernel's BPF run-time statistics stay off (no program costs)
	// EnableStats switches the statistics on (nil: bpfstats.Enable); tests wrap it to prove the
	// switch is given back on every path.
	EnableStats EnableFunc
	Log         func(format string, args ...any)
}

// EnableFunc switches the kernel's BPF run-time statistics on until the switch is closed.
type EnableFunc func() (*bpfstats.Switch, error)

// Set is a run's probes over its testbeds.
type Set struct {
	stage *stage.Probe
	devs  map[stage.DevKey]stage.DeviceInfo
	costs *costProbe
	// Notes say what could not be measured, for the run's notes.
	Notes []string
}

// Start loads the run's probes for the testbeds. It does not fail: a probe that cannot start
// is logged, noted in Notes and left out. Close gives everything back.
func Start(beds []*testbed.Testbed, o Options) *Set {
	logf := o.Log
	if logf == nil {
		logf = func(string, ...any) {}
	}
	s := &Set{}
	if !o.NoStageProbe {
		var nss []string
		for _, tb := range beds {
			nss = append(nss, tb.Namespaces()...)
		}
		sp, err := stage.Start(stage.Options{NetnsNames: nss})
		if err != nil {
			logf("stage probe unavailable, continuing without per-stage attribution: %v", stage.Explain(err))
			s.Notes = append(s.Notes, "stage probe unavailable: "+err.Error())
		} else {
			s.stage = sp
			s.devs, _ = stage.ResolveDevices()
		}
	}
	if !o.NoBPFStats {
		enable := o.EnableStats
		if enable == nil {
			enable = bpfstats.Enable
		}
		cp, err := startCost(beds, s.stage, enable)
		if err != nil {
			logf("continuing without eBPF program costs: %v", err)
			s.Notes = append(s.Notes, "no eBPF program costs: "+err.Error())
		} else {
			s.costs = cp
			s.Notes = append(s.Notes, cp.notes...)
		}
	}
	return s
}

// Close detaches the calibration programs, restores the statistics switch and unloads the
// stage probe.
func (s *Set) Close() error {
	var err error
	if cerr := s.costs.close(); cerr != nil {
		err = fmt.Errorf("restore BPF statistics: %w", cerr)
	}
	s.costs = nil
	if s.stage != nil {
		s.stage.Close()
	}
	return err
}

// Rep is the sampling of one repetition in flight.
type Rep struct {
	set     *Set
	tb      *testbed.Testbed
	sampler *probe.Sampler
	other   *otherLoad
	before  stage.Snapshot
	progs   map[ebpf.ProgramID]bpfstats.Sample
	links   linkDrops
}

// Begin starts sampling a repetition on a testbed's measured pair. The receiver's counters say
// what arrived out of order; the sender's how TCP paid for it (SACK reordering detected,
// retransmits, spurious RTOs).
func (s *Set) Begin(tb *testbed.Testbed) (*Rep, error) {
	nss := map[string][]string{tb.Receiver.Netns: probe.DefaultCounters}
	if snd := tb.Sender.Netns; snd != tb.Receiver.Netns {
		nss[snd] = probe.DefaultCounters
	}
	r := &Rep{set: s, tb: tb, sampler: probe.NewSampler(probe.SamplerConfig{Namespaces: nss})}
	if err := r.sampler.Start(); err != nil {
		return nil, errors.New("probes: " + err.Error())
	}
	r.other = startOtherLoad()
	r.links = readLinkDrops(tb.Namespaces())
	if s.stage != nil {
		r.before, _ = s.stage.Snapshot()
	}
	s.costs.refresh(tb)
	r.progs = s.costs.sample(tb)
	return r, nil
}

// End stops sampling right after the workload and fills rep: the eBPF programs' runs (before
// any the rep has already), CPU shares, softirqs, interrupts and counters, the other processes'
// CPU, and the stage attribution. rep.Metrics must already hold the workload's metrics.
func (r *Rep) End(rep *results.Rep) {
	s := r.set
	var after stage.Snapshot
	if s.stage != nil {
		after, _ = s.stage.Snapshot()
	}
	if r.progs != nil {
		rep.Programs = append(s.costs.programRuns(r.tb, r.progs, s.costs.sample(r.tb)), rep.Programs...)
	}
	links := readLinkDrops(r.tb.Namespaces())
	if rpt, err := r.sampler.Stop(); err == nil && rpt != nil {
		fillProbes(rep, rpt, r.tb.Receiver.Netns, r.tb.Sender.Netns)
	}
	fillDrops(rep, links.since(r.links), len(r.links) > 0 && len(links) > 0)
	r.other.finish(rep)
	if s.stage != nil {
		d := after.Sub(r.before)
		d.Annotate(s.devs)
		rep.Stages = stageRows(d, r.tb.Stages)
		rep.NetRxNs = netRxNs(d)
	}
}

// fillProbes copies the sampler's interval totals into the rep.
func fillProbes(rep *results.Rep, r *probe.Report, recvNs, sendNs string) {
	t := r.Totals
	if rep.Metrics == nil {
		rep.Metrics = map[string]float64{}
	}
	rep.Counters = map[string]float64{}
	if t.CPU != nil {
		busy := 0.0
		for _, c := range t.CPU.PerCPU {
			rep.CPU = append(rep.CPU, results.CPUShare{CPU: c.CPU, User: c.User + c.Nice, System: c.System, IRQ: c.IRQ,
				Softirq: c.SoftIRQ, Idle: c.Idle + c.IOWait, Steal: c.Steal})
			busy += c.Busy
		}
		rep.Metrics[results.MetricCPUBusy] = busy
	}
	if t.Softirqs != nil {
		rep.Softirqs = map[string][]uint64{}
		for _, name := range []string{"NET_RX", "NET_TX"} {
			if v, ok := t.Softirqs.Counts[name]; ok {
				rep.Softirqs[name] = v
			}
		}
	}
	fillInterrupts(rep, t.Interrupts)
	if t.Softnet != nil {
		rep.Counters["softnet.processed"] = float64(t.Softnet.Total.Processed)
		rep.Counters["softnet.dropped"] = float64(t.Softnet.Total.Dropped)
		rep.Counters["softnet.time_squeeze"] = float64(t.Softnet.Total.TimeSqueeze)
		rep.Counters["softnet.received_rps"] = float64(t.Softnet.Total.ReceivedRPS)
	}
	for name, v := range t.Nstat[recvNs] {
		rep.Counters["receiver."+name] = float64(v)
	}
	if sendNs != recvNs {
		for name, v := range t.Nstat[sendNs] {
			rep.Counters["sender."+name] = float64(v)
		}
	}
}

// stageRows turns a stage-probe delta into per-(device, CPU) rows named by lab stage.
func stageRows(d stage.Snapshot, stages map[string]string) []results.StageCPU {
	var rows []results.StageCPU
	for _, dc := range d.Devices {
		if dc.Packets == 0 && dc.RxPackets == 0 && dc.SoftirqNs == 0 {
			continue
		}
		st := stages[dc.NetnsName+"/"+dc.Name]
		if dc.Name == stage.BacklogName {
			st = "backlog"
		}
		if st == "" {
			continue // a device of another lab or outside the path
		}
		pk := dc.Packets
		if pk == 0 {
			pk = dc.RxPackets
		}
		rows = append(rows, results.StageCPU{Stage: st, Netns: dc.NetnsName, Device: dc.Name, CPU: dc.CPU, Packets: pk, SoftirqNs: dc.SoftirqNs})
	}
	return rows
}
