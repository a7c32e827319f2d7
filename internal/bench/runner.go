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

	"github.com/peregrine-net/peregrine/internal/bench/probes"
	"github.com/peregrine-net/peregrine/internal/bench/testbed"
	"github.com/peregrine-net/peregrine/internal/lab"
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
	// ModeCPUs, set, are the CPUs every mode may steer to (attach's --cpus: falcon's set, rps's
	// masks, mflow's splitting CPUs); empty = each mode's default (all online, mflow the first two).
	// With them a big machine measures as an N-CPU one (scripts/device-bench.sh).
	ModeCPUs     []int
	NoStageProbe bool
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

	// enableStats switches the BPF statistics on (nil: bpfstats.Enable); tests wrap it.
	enableStats probes.EnableFunc
	probes      *probes.Set // the run in flight's
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
	if err := o.k8sArrangement(); err != nil {
		return nil, "", err
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
			Params: map[string]any{"duration_s": sc.Duration.Seconds(), "sizes": sc.Sizes, "flows": sc.Flows, "proto": sc.Proto, "rate": sc.Rate, "background": sc.Background, "hp_rt": sc.HPRealTime, "injector": sc.Injector, "rates": sc.Rates,
				"same_node": sc.SameNode, "via_service": sc.ViaService, "proxy_mode": sc.ProxyMode, "ipv6": sc.IPv6}},
		Arrangement: results.Arrangement{SenderCPUs: o.SenderCPUs, IRQCPUs: o.RxCPUs, AppCPUs: o.AppCPUs, StageCPUs: o.ModeCPUs,
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
	o.k8sRecord(run)
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
	tbs := make([]*testbed.Testbed, len(beds))
	for i, b := range beds {
		tbs[i] = b.Testbed
	}
	o.probes = probes.Start(tbs, probes.Options{NoStageProbe: o.NoStageProbe, NoBPFStats: o.NoBPFStats, EnableStats: o.enableStats, Log: o.Logf})
	run.Notes = append(run.Notes, o.probes.Notes...)
	defer func() {
		err = errors.Join(err, o.probes.Close())
		o.probes = nil
	}()
	xs := sc.points()
	total := len(xs) * (sc.Reps + sc.Warmup) * len(beds)
	prog := newProgress(o.Log, total)
	points := map[string]*results.Point{}
	var order []string
	// The points measured so far go into the run on every return: an interrupted run is
	// written with what it measured, marked incomplete.
	defer func() {
		for _, k := range order {
			if len(points[k].Reps) > 0 {
				run.Points = append(run.Points, *points[k])
			}
		}
	}()
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
				rep := o.measureRep(ctx, b, x)
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
	if failures > 0 {
		return fmt.Errorf("%d of %d measurements failed (see each rep's error in the result file)", failures, total)
	}
	run.Complete = true
	return nil
}

// measureRep runs one repetition with the probes around it.
func (o *Options) measureRep(ctx context.Context, b bed, x map[string]float64) results.Rep {
	rep := results.Rep{Started: time.Now()}
	// A config sharing its lab (k8s) has its modes attached now, the others' detached.
	if err := b.Activate(ctx); err != nil {
		rep.Error = err.Error()
		return rep
	}
	modesBefore := sampleModes(b.Testbed) // once attached; outside the sampled interval: it may walk a table
	rep.Started = time.Now()
	sampling, err := o.probes.Begin(b.Testbed)
	if err != nil {
		rep.Error = err.Error()
		return rep
	}
	var h *hog
	if len(o.Scenario.HogCPUs) > 0 {
		h = startHog(o.Scenario.HogCPUs)
	}
	// A workload with a setup inside the rep (udp-flows opens its flows) counts the modes'
	// packets from its end (modecounters.go).
	ctx = context.WithValue(ctx, modesFromKey{}, func() { modesBefore = sampleModes(b.Testbed) })
	// A repetition has a limit: on a path that stalls (a packet lost per exchange, recovered by
	// a 200 ms RTO each time) a workload's setup, e.g. memcached's preload, can run for minutes.
	repCtx, cancel := context.WithTimeout(ctx, o.Scenario.repLimit())
	metrics, raw, err := o.Scenario.measure(repCtx, b.pair, x)
	if err != nil && repCtx.Err() != nil && ctx.Err() == nil {
		err = fmt.Errorf("repetition cut after %s, its limit (the path stalls?): %w", o.Scenario.repLimit(), err)
	}
	cancel()
	h.stop()
	rep.Duration = time.Since(rep.Started)
	rep.Metrics, rep.Raw = metrics, raw
	takeSender(&rep)
	if err != nil {
		rep.Error = err.Error()
	}
	sampling.End(&rep)
	sampleModes(b.Testbed).record(modesBefore, &rep) // modecounters.go
	return rep
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
