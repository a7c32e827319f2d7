package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/peregrine-net/peregrine/internal/bench/testbed"
	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/probe"
	"github.com/peregrine-net/peregrine/internal/probe/stage"
	"github.com/peregrine-net/peregrine/internal/results"
	"github.com/peregrine-net/peregrine/internal/results/format"
	"github.com/peregrine-net/peregrine/internal/workload"
)

// Options are one benchmark run's settings.
type Options struct {
	Configs  []Config
	Scenario Scenario
	// The CPU arrangement. RxCPUs pins the underlay's receive (the emulated NIC IRQ core);
	// SenderCPUs the sending application or injector (the "remote host"); AppCPUs the receiving
	// application. Defaults on a machine with 2+ CPUs: receive and app on CPU0, sender on CPU1.
	RxCPUs, SenderCPUs, AppCPUs []int
	NoStageProbe                bool
	// ToR builds every lab with a top-of-rack switch per host (lab.Spec.ToR; mode ezpath needs
	// them); the results' underlay is then "tor".
	ToR bool
	// NAPIThread runs each lab's underlay NAPI in a kernel thread pinned to RxCPUs
	// (lab.Spec.NAPIThread): the NIC stage then runs on the emulated IRQ core, not the sender's.
	NAPIThread bool
	// NoBPFStats leaves the kernel's BPF run-time statistics off: no per-program costs, but no
	// statistics overhead (~70 ns per program run) on the measured path either.
	NoBPFStats bool
	// ModeExtra are extra attach options for the modes (datapath.Options.Extra), e.g. prism's
	// rules; see modeExtra for the defaults a mode gets in a benchmark.
	ModeExtra map[string]string
	// Given, if set, measures between existing namespaces instead of building labs; Configs
	// is then ignored.
	Given   *Given
	OutDir  string    // where the result JSON goes
	Log     io.Writer // progress; nil for silence
	Version string

	costs *costProbe // per-program accounting of the run in flight
}

// DefaultArrangement fills unset CPU lists like the papers' testbed, scaled to this machine:
// receive (the NIC IRQ core) on CPU0, the receiving application on CPU1, the sender (the
// remote host) on CPU2. With two CPUs the sender shares CPU1 with the application: the IRQ
// core is kept for the kernel's receive path, as on a real receiver, and the application is
// not starved by softirqs on the IRQ core (receive livelock).
func (o *Options) DefaultArrangement() {
	n := runtime.NumCPU()
	pick := func(i int) []int {
		if i >= n {
			i = n - 1
		}
		return []int{i}
	}
	if o.RxCPUs == nil {
		o.RxCPUs = pick(0)
	}
	if o.AppCPUs == nil {
		o.AppCPUs = pick(1)
	}
	if o.SenderCPUs == nil {
		o.SenderCPUs = pick(2)
	}
}

// Logf writes a progress line to Log, if any.
func (o *Options) Logf(format string, args ...any) {
	if o.Log != nil {
		fmt.Fprintf(o.Log, format+"\n", args...)
	}
}

// Run measures the scenario on every config and returns the run, also written to OutDir. On
// failure or interruption the partial run is still written, marked incomplete, and every lab,
// attachment and process is removed.
func Run(ctx context.Context, o Options) (*results.Run, string, error) {
	if err := o.Scenario.Validate(); err != nil {
		return nil, "", err
	}
	if o.Given != nil {
		if err := o.Given.validate(o.Scenario.Name); err != nil {
			return nil, "", err
		}
		o.Configs = []Config{{Style: StyleGiven, Mode: o.Given.name()}}
	}
	if len(o.Configs) == 0 {
		return nil, "", errors.New("no configuration to measure")
	}
	o.DefaultArrangement()
	if err := lab.Preflight(); err != nil {
		return nil, "", err
	}
	if err := workload.Require(o.Scenario.tools()...); err != nil {
		return nil, "", err
	}
	sc := &o.Scenario
	run := &results.Run{
		Schema: results.Schema, ID: fmt.Sprintf("%s-%s", sc.Name, time.Now().Format("20060102-150405")),
		Started: time.Now(), Env: environment(o.Version),
		Lab: results.Lab{Hosts: 2, Containers: sc.containers(), MTU: 1500, Underlay: o.underlayName(), RxCPUs: o.RxCPUs, NAPIThread: o.NAPIThread},
		Scenario: results.Scenario{Name: sc.Name, Workload: sc.def().workload, Repetitions: sc.Reps, Warmup: sc.Warmup,
			Interleaved: true, Primary: sc.def().primary, Baseline: o.Configs[0].Name(),
			Params: map[string]any{"duration_s": sc.Duration.Seconds(), "sizes": sc.Sizes, "flows": sc.Flows, "proto": sc.Proto, "rate": sc.Rate, "background": sc.Background, "hp_rt": sc.HPRealTime, "injector": sc.Injector, "rates": sc.Rates}},
		Arrangement: results.Arrangement{SenderCPUs: o.SenderCPUs, IRQCPUs: o.RxCPUs, AppCPUs: o.AppCPUs,
			Note: "underlay receive pinned with RPS to the IRQ CPUs (a NIC's RSS/IRQ affinity); sender and receiving app pinned with taskset"},
	}
	if o.NAPIThread {
		run.Arrangement.Note += "; the underlay's NAPI (GRO, the NIC stage) runs in a kernel thread pinned to the IRQ CPUs (its time is not NET_RX softirq time: the receive cost figures miss it; a veth's NAPI ring holds 256 frames, so a delayed thread drops)"
	} else {
		run.Arrangement.Note += "; the underlay's NAPI (GRO) runs on the sending CPU, as veth does"
	}
	if sc.HPRealTime {
		run.Arrangement.Note += fmt.Sprintf("; latency workload at real-time priority (SCHED_FIFO %d)", hpRealTimePriority)
	}
	if o.Given != nil {
		run.Lab = results.Lab{Name: "given namespaces", Styles: []string{StyleGiven}}
		run.Arrangement.Note = "measured between given namespaces; no lab was built, the receive path is as found"
	}
	path := filepath.Join(o.OutDir, run.ID+".json")
	err := o.run(ctx, run)
	run.Finished = time.Now()
	if err != nil {
		run.Complete, run.Error = false, err.Error()
	}
	run.Derive()
	for _, p := range run.Validate() {
		run.Notes = append(run.Notes, "validation: "+p.Error())
	}
	if o.OutDir != "" {
		if werr := os.MkdirAll(o.OutDir, 0o755); werr != nil {
			return run, "", errors.Join(err, werr)
		}
		if werr := run.Write(path); werr != nil {
			return run, "", errors.Join(err, werr)
		}
	} else {
		path = ""
	}
	return run, path, err
}

func (o *Options) run(ctx context.Context, run *results.Run) (err error) {
	sc := &o.Scenario
	var beds []bed
	defer func() {
		for _, b := range beds {
			if terr := b.Teardown(); terr != nil {
				err = errors.Join(err, fmt.Errorf("teardown %s: %w", b.Config, terr))
			}
		}
	}()
	if err := o.buildBeds(ctx, run, &beds); err != nil {
		return err
	}
	var sp *stage.Probe
	var devs map[stage.DevKey]stage.DeviceInfo
	if !o.NoStageProbe {
		var nss []string
		for _, b := range beds {
			nss = append(nss, b.Namespaces()...)
		}
		if sp, err = stage.Start(stage.Options{NetnsNames: nss}); err != nil {
			o.Logf("stage probe unavailable, continuing without per-stage attribution: %v", stage.Explain(err))
			run.Notes = append(run.Notes, "stage probe unavailable: "+err.Error())
			sp = nil
		} else {
			defer sp.Close()
			devs, _ = stage.ResolveDevices()
		}
	}
	if !o.NoBPFStats {
		tbs := make([]*testbed.Testbed, len(beds))
		for i, b := range beds {
			tbs[i] = b.Testbed
		}
		cp, cerr := startCost(tbs, sp)
		if cerr != nil {
			o.Logf("continuing without eBPF program costs: %v", cerr)
			run.Notes = append(run.Notes, "no eBPF program costs: "+cerr.Error())
		} else {
			o.costs = cp
			run.Notes = append(run.Notes, cp.notes...)
			defer func() {
				o.costs = nil
				if cerr := cp.close(); cerr != nil {
					err = errors.Join(err, fmt.Errorf("restore BPF statistics: %w", cerr))
				}
			}()
		}
	}
	xs := sc.points()
	total := len(xs) * (sc.Reps + sc.Warmup) * len(beds)
	prog := newProgress(o.Log, total)
	points := map[string]*results.Point{}
	var order []string
	failures := 0
	for _, x := range xs {
		for r := 0; r < sc.Reps+sc.Warmup; r++ {
			// Interleave configs and rotate who goes first, so drift and order effects hit all alike.
			for k := range beds {
				b := beds[(k+r)%len(beds)]
				if err := ctx.Err(); err != nil {
					return fmt.Errorf("interrupted: %w", err)
				}
				key := b.Config + "|" + results.XKey(x)
				pt := points[key]
				if pt == nil {
					pt = &results.Point{Config: b.Config, X: x}
					points[key] = pt
					order = append(order, key)
				}
				rep := o.measureRep(ctx, b, x, sp, devs)
				rep.Index, rep.Warmup = r, r < sc.Warmup
				pt.Reps = append(pt.Reps, rep)
				status := ""
				if rep.Error != "" {
					failures++
					status = " FAILED: " + firstLine(rep.Error)
				} else if v, ok := rep.Metrics[sc.def().primary]; ok {
					status = " " + format.Value(sc.def().primary, v)
				}
				warm := ""
				if rep.Warmup {
					warm = " (warm-up)"
				}
				prog.step(fmt.Sprintf("%s %s rep %d%s%s", b.Config, describeX(x), r, warm, status))
			}
		}
	}
	for _, k := range order {
		run.Points = append(run.Points, *points[k])
	}
	if failures > 0 {
		return fmt.Errorf("%d of %d measurements failed (see each rep's error in the result file)", failures, total)
	}
	run.Complete = true
	return nil
}

// measureRep runs one repetition with the probes around it.
func (o *Options) measureRep(ctx context.Context, b bed, x map[string]float64, sp *stage.Probe, devs map[stage.DevKey]stage.DeviceInfo) results.Rep {
	rep := results.Rep{Started: time.Now()}
	// The receiver's counters say what arrived out of order; the sender's how TCP paid for it
	// (SACK reordering detected, retransmits, spurious RTOs).
	nss := map[string][]string{b.pair.receiver.Netns: probe.DefaultCounters}
	if s := b.pair.sender.Netns; s != b.pair.receiver.Netns {
		nss[s] = probe.DefaultCounters
	}
	sampler := probe.NewSampler(probe.SamplerConfig{Namespaces: nss})
	if err := sampler.Start(); err != nil {
		rep.Error = "probes: " + err.Error()
		return rep
	}
	other := startOtherLoad()
	var before stage.Snapshot
	if sp != nil {
		before, _ = sp.Snapshot()
	}
	progsBefore := o.costs.sample(b.Testbed)
	var h *hog
	if len(o.Scenario.HogCPUs) > 0 {
		h = startHog(o.Scenario.HogCPUs)
	}
	metrics, raw, err := o.Scenario.measure(ctx, b.pair, x)
	h.stop()
	rep.Duration = time.Since(rep.Started)
	var after stage.Snapshot
	if sp != nil {
		after, _ = sp.Snapshot()
	}
	if progsBefore != nil {
		rep.Programs = o.costs.programRuns(b.Testbed, progsBefore, o.costs.sample(b.Testbed))
	}
	rpt, serr := sampler.Stop()
	rep.Metrics, rep.Raw = metrics, raw
	takeSender(&rep)
	if err != nil {
		rep.Error = err.Error()
	}
	if serr == nil && rpt != nil {
		fillProbes(&rep, rpt, b.pair.receiver.Netns, b.pair.sender.Netns)
	}
	other.finish(&rep)
	if sp != nil {
		d := after.Sub(before)
		d.Annotate(devs)
		rep.Stages = stageRows(d, b.Stages)
		rep.NetRxNs = netRxNs(d)
	}
	return rep
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

func describeX(x map[string]float64) string {
	return fmt.Sprintf("size %dB flows %d", int(x["size"]), int(x["flows"]))
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// underlayName is what the results call the underlay: direct, or tor with --tor.
func (o *Options) underlayName() string {
	if o.ToR {
		return "tor"
	}
	return lab.UnderlayDirect
}
