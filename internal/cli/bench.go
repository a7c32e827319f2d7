package cli

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/peregrine-net/peregrine/internal/bench"
	"github.com/peregrine-net/peregrine/internal/bench/suite"
	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/report"
	"github.com/peregrine-net/peregrine/internal/results"
)

// benchFlags are the options shared by every bench subcommand.
type benchFlags struct {
	sizes, flows, rx, sender, app string
	modeCPUs                      string
	hog                           string
	duration                      time.Duration
	reps, warmup, rate            int
	proto, out                    string
	noStage, asJSON, noReport     bool
	noBPFStats                    bool
	background                    string
	modeOpts                      []string
	hpRT                          bool
	injector, rates               string
	tor, napiThread               bool
	sameNode, viaService, ipv6    bool
	ipv6Underlay                  bool
	proxyMode                     string
}

func (b *benchFlags) add(c *cobra.Command, withSweep bool) {
	f := c.Flags()
	if withSweep {
		f.StringVar(&b.sizes, "sizes", "", "message sizes in bytes, e.g. 16,64,1024 (default per scenario)")
		f.StringVar(&b.flows, "flows", "", "flow counts, e.g. 1,2,4,8 (default per scenario)")
		f.DurationVar(&b.duration, "duration", 5*time.Second, "length of one measurement (whole seconds)")
		f.IntVar(&b.reps, "reps", 3, "measured repetitions per point and config")
		f.IntVar(&b.warmup, "warmup", 1, "discarded warm-up repetitions before them")
		f.StringVar(&b.proto, "proto", "tcp", "pingpong/underload: tcp or udp")
		f.StringVar(&b.hog, "hog-cpus", "", "keep these CPUs busy with a spinning thread during each measurement (an induced hotspot), e.g. 1")
		f.IntVar(&b.rate, "rate", 0, "underload: messages/s (default 10000); udp-inject: packets/s (0 = as fast as possible)")
		f.StringVar(&b.rates, "rates", "", "udp-inject: sweep the offered load, packets/s, e.g. 50000,100000,200000,0 (0 = as fast as the sender goes); each rate is a point")
		f.StringVar(&b.injector, "injector", "auto", "udp-inject sender: auto (xdp flat out, packet at an offered --rate/--rates: the XDP sender cannot pace smoothly), xdp (live-frame XDP, cheap per frame; needs GRO on the receiving underlay veth, as the lab sets) or packet (AF_PACKET sendmmsg, paces exactly)")
		f.StringVar(&b.background, "background", "none", "latency scenarios: bulk iperf3 tcp|udp|none between a second container pair during the measurement (LP throughput recorded as lp_throughput_bps)")
		f.BoolVar(&b.hpRT, "hp-rt", false, "pingpong/underload: run sockperf (both ends) at real-time priority (SCHED_FIFO 10), the stand-in for a latency application with a core of its own: the tail then shows what the network path queues, not the CPU scheduler (on 2 vCPUs a bulk background otherwise sets the p99 even with no overlay at all)")
		f.StringArrayVar(&b.modeOpts, "mode-opt", nil, "an option KEY=VALUE for every mode of the run that declares KEY (repeatable; `peregrine options MODE` lists them), e.g. --mode-opt \"rules=dport=11111;sport=11111\" for prism's HP rules (by default prism makes the measured workload's port HP, both directions)")
	}
	f.StringVar(&b.rx, "rx-cpus", "", "CPUs the underlay's receive is pinned to, the emulated NIC IRQ core (default 0)")
	f.StringVar(&b.app, "app-cpus", "", "CPUs of the receiving application (default 1)")
	f.StringVar(&b.modeCPUs, "mode-cpus", "", "CPUs every attached mode may steer to, as attach's --cpus (falcon's set, rps's masks, mflow's splitting CPUs), e.g. 0-3: with --rx-cpus, --app-cpus and --sender-cpus inside or beside them a big machine measures as a smaller one (default: each mode's own, all online CPUs; mflow the first two)")
	f.StringVar(&b.sender, "sender-cpus", "", "CPUs of the sender, the emulated remote host (default 2, or the last CPU)")
	f.StringVar(&b.out, "out", "results", "directory for result JSON files and the HTML report")
	f.BoolVar(&b.noStage, "no-stage-probe", false, "do not load the eBPF stage probe (per-stage CPU attribution)")
	f.BoolVar(&b.noBPFStats, "no-bpf-stats", false, "leave the kernel's BPF run-time statistics off: no per-program ns per run, and none of their ~70 ns per program run on the measured path")
	f.BoolVar(&b.napiThread, "napi-thread", false, "run each lab's underlay NAPI (GRO, the NIC stage) in a kernel thread pinned to --rx-cpus, as a NIC's IRQ affinity does; without it a veth polls its peer on the sending CPU, so the emulated sender's core pays for the receiver's NIC stage. Caveats: the thread's time is not NET_RX softirq time (the receive cost figures miss it), and a veth's NAPI ring holds only 256 frames, so a delayed thread drops (retransmits show in the reordering and loss block)")
	f.BoolVar(&b.tor, "tor", false, "labs with a top-of-rack switch per host (lab up --tor), which mode ezpath needs; every config crosses the same switches")
	f.BoolVar(&b.asJSON, "json", false, "print the result JSON on stdout instead of the table")
	f.BoolVar(&b.noReport, "no-report", false, "do not write the HTML report")
}

func (b *benchFlags) options(configs []bench.Config, scenario string) (bench.Options, error) {
	o := bench.Options{Configs: configs, OutDir: b.out, NoStageProbe: b.noStage, NoBPFStats: b.noBPFStats, Log: os.Stderr, Version: Version, ToR: b.tor, NAPIThread: b.napiThread}
	var err error
	for _, x := range []struct {
		flag string
		src  string
		dst  *[]int
	}{{"--rx-cpus", b.rx, &o.RxCPUs}, {"--sender-cpus", b.sender, &o.SenderCPUs}, {"--app-cpus", b.app, &o.AppCPUs}, {"--mode-cpus", b.modeCPUs, &o.ModeCPUs}} {
		if x.src == "" {
			continue
		}
		if *x.dst, err = parseCPUList(x.src); err != nil {
			return o, fmt.Errorf("%s: %w", x.flag, err)
		}
	}
	o.Scenario = bench.Scenario{Name: scenario, Duration: b.duration, Reps: b.reps, Warmup: b.warmup, Proto: b.proto, Rate: b.rate, Background: b.background, HPRealTime: b.hpRT,
		SameNode: b.sameNode, ViaService: b.viaService, ProxyMode: b.proxyMode, IPv6: b.ipv6, IPv6Underlay: b.ipv6Underlay}
	o.Scenario.Injector = b.injector // used by udp-inject (and by a suite's udp-inject steps)
	if b.rates != "" {
		if o.Scenario.Rates, err = parseIntList(b.rates); err != nil {
			return o, fmt.Errorf("--rates: %w", err)
		}
	}
	if o.ModeExtra, err = modeOptions(b.modeOpts, configs); err != nil {
		return o, err
	}
	if b.sizes != "" {
		if o.Scenario.Sizes, err = parseIntList(b.sizes); err != nil {
			return o, fmt.Errorf("--sizes: %w", err)
		}
	}
	if b.flows != "" {
		if o.Scenario.Flows, err = parseIntList(b.flows); err != nil {
			return o, fmt.Errorf("--flows: %w", err)
		}
	}
	if b.hog != "" {
		if o.Scenario.HogCPUs, err = parseCPUList(b.hog); err != nil {
			return o, fmt.Errorf("--hog-cpus: %w", err)
		}
		if err := datapath.CheckCPUs(o.Scenario.HogCPUs); err != nil {
			return o, fmt.Errorf("--hog-cpus: %w", err)
		}
	}
	return o, o.Scenario.Validate()
}

func newBenchCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "bench",
		Short: "Measure overlay styles and datapath modes side by side, with probes, into result files",
		Long: `Benchmarks build one lab per configuration (a style with a datapath mode), run a workload
over every point of a sweep with repetitions interleaved across configurations (A/B/A/B, the
first config rotating), sample per-CPU time, softirqs, softnet and nstat counters and the eBPF
stage probe around every repetition, and write one JSON result per scenario (schema:
docs/results-schema.md). Ratios are measured in one run against the first configuration.

The CPU arrangement is explicit and recorded in every result: --rx-cpus pins the underlay's
receive (the emulated NIC IRQ core, default CPU0), --app-cpus the receiving application
(default CPU1), --sender-cpus the sender, the emulated remote host (default CPU2; on a 2-CPU
machine it shares CPU1 with the application).

Scenarios:
` + bench.ScenarioHelp(),
	}
	c.AddCommand(newBenchRunCmd(), newBenchCompareCmd(), newBenchStudyCmd(), newBenchSuiteCmd(), newBenchScoreCmd(), newBenchProjectCmd())
	return c
}

func newBenchRunCmd() *cobra.Command {
	var b benchFlags
	var configs string
	var given bench.Given
	c := &cobra.Command{
		Use:   "run SCENARIO",
		Short: "Run one scenario on a list of configurations (style[/mode]), or between given namespaces",
		Example: `  peregrine bench run tcp --configs native,docker,flannel
  peregrine bench run udp-inject --configs native,docker --sizes 16,64,1024 --reps 5
  peregrine bench run pingpong --configs docker,docker/rps --proto udp
  # any two existing namespaces, no lab built (e.g. a real node's containers)
  peregrine bench run tcp --server-ns web --server-addr 10.0.1.5 --client-ns client`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfgs, err := bench.ParseConfigs(configs)
			if err != nil {
				return err
			}
			o, err := b.options(cfgs, args[0])
			if err != nil {
				return err
			}
			if given.ServerNS != "" || given.ServerAddr != "" || given.ClientNS != "" {
				o.Given = &given
			}
			return runBench(o, &b)
		},
	}
	b.add(c, true)
	c.Flags().StringVar(&given.ServerNS, "server-ns", "", "measure between existing namespaces: the receiving namespace (no lab is built)")
	c.Flags().StringVar(&given.ServerAddr, "server-addr", "", "with --server-ns: the receiver's address")
	c.Flags().StringVar(&given.ClientNS, "client-ns", "", "with --server-ns: the sending namespace (default: the current one)")
	c.Flags().StringVar(&configs, "configs", "native,docker,flannel", "configurations: native, linux (VXLAN in the host namespace, no containers), docker, flannel, real-flannel, calico (Calico VXLAN's routed layout), k8s (the Kubernetes lab that is up, shared by the run's k8s configs); all but native and linux optionally /MODE (e.g. docker/rps, k8s/fastpath); the first is the baseline")
	return c
}

func newBenchCompareCmd() *cobra.Command {
	var b benchFlags
	var modes, style string
	c := &cobra.Command{
		Use:   "compare SCENARIO",
		Short: "Compare datapath modes on one overlay style, each as a ratio against the native path (on the k8s cluster: against vanilla)",
		Example: `  peregrine bench compare tcp --modes vanilla,rps
  peregrine bench compare udp-inject --modes vanilla,rps --style flannel --sizes 16,64,1024
  peregrine bench compare tcp --modes vanilla,fastpath --style flannel --via-service --proxy-mode nftables
  peregrine bench compare tcp --modes vanilla,fastpath --style flannel --same-node
  peregrine bench compare tcp --modes vanilla,fastpath --style real-flannel
  peregrine bench compare tcp --modes vanilla,fastpath --style calico  # Calico VXLAN's routed layout
  # on the real Kubernetes lab (up first: sudo peregrine lab up --style k8s --no-agent)
  peregrine bench compare tcp --style k8s --reps 3 --duration 3s   # vanilla,fastpath,prism
  peregrine bench compare pingpong --style k8s --via-service        # through a ClusterIP
  peregrine bench compare tcp --style flannel --ipv6 --via-service  # through an IPv6 ClusterIP (dual-stack lab)
  peregrine bench compare crr --style flannel --ipv6 --via-service --same-node  # the ClusterIP's backend on the client's node`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var ms []string
			for _, m := range strings.Split(modes, ",") {
				if m = strings.TrimSpace(m); m != "" {
					ms = append(ms, m)
				}
			}
			if style == bench.StyleK8s {
				if err := k8sCompareFlags(cmd, &ms); err != nil {
					return err
				}
			}
			cfgs, err := bench.ModeConfigs(style, ms)
			if err != nil {
				return err
			}
			if b.ipv6Underlay && !b.ipv6 {
				return fmt.Errorf("--ipv6-underlay needs --ipv6 (it measures between the pods' IPv6 addresses)")
			}
			if b.ipv6 && style != "flannel" {
				return fmt.Errorf("--ipv6 needs --style flannel (the dual-stack lab), not %s", style)
			}
			if (b.sameNode || b.viaService || b.ipv6) && style != bench.StyleK8s {
				// No native baseline: it has no pods on one node and no Services; the first
				// mode (vanilla) is the baseline.
				cfgs = cfgs[1:]
			}
			o, err := b.options(cfgs, args[0])
			if err != nil {
				return err
			}
			return runBench(o, &b)
		},
	}
	b.add(c, true)
	c.Flags().StringVar(&modes, "modes", bench.DefaultCompareModes, "datapath modes to compare (vanilla = nothing attached; with --style k8s the default is "+bench.K8sCompareModes+")")
	c.Flags().StringVar(&style, "style", "docker", "overlay style the modes run on: docker, flannel, real-flannel (flannel's own etcd, flanneld and CNI plugin; scripts/setup.sh builds them), real-flannel-nocsum (the same with flannel.1's outer UDP checksums off), calico (Calico VXLAN's layout as calico-node and its CNI plugin program it: vxlan.calico, unbridged cali* veths with proxy ARP, /32 routes) or k8s (the real Kubernetes lab that is up: `lab up --style k8s --no-agent`; between kubelet's pods on node 1 and node 2, across flannel's VXLAN; no native baseline, modes default vanilla,fastpath,prism; see docs/bench.md)")
	c.Flags().BoolVar(&b.sameNode, "same-node", false, "measure between two pods of one node (the sender's host) instead of across the overlay (tcp, udp, pingpong, underload; with --ipv6: tcp, udp; with --via-service: the client moves to the Service backend's node, TCP scenarios and crr; no native baseline: the first mode is the baseline)")
	c.Flags().BoolVar(&b.viaService, "via-service", false, "the client connects to a Service's ClusterIP whose one backend is the receiver, instead of the receiver's own address (flannel style: kube-proxy style rules, lab up --services; k8s style: Service prg-bench the bench creates, through kube-proxy's own rules; TCP; no native baseline: the first mode is the baseline)")
	c.Flags().BoolVar(&b.ipv6Underlay, "ipv6-underlay", false, "with --ipv6: real flannel's dual-stack layout (lab up --ipv6-underlay): the pods' IPv6 on flannel-v6.1, VXLAN over the nodes' IPv6 addresses, beside flannel.1 for IPv4")
	c.Flags().BoolVar(&b.ipv6, "ipv6", false, "flannel style: measure between the pods' IPv6 addresses on a dual-stack lab (lab up --ipv6: IPv6 inside flannel.1, the IPv4 underlay outside; tcp, udp and crr; with --via-service through the Service's IPv6 ClusterIP, tcp and crr; no native baseline: the first mode is the baseline)")
	c.Flags().StringVar(&b.proxyMode, "proxy-mode", "", "with --via-service on the flannel style: kube-proxy's mode, iptables (default) or nftables (the k8s style's is the cluster's: lab up --style k8s --proxy-mode)")
	return c
}

func newBenchStudyCmd() *cobra.Command {
	c := newBenchSuiteCmd()
	c.Use = "study"
	c.Short = "Run the characterization study (native vs Linux overlay vs docker vs flannel) and write the HTML report"
	c.Long = `The study reproduces chapter 2 of the dissertation: TCP throughput vs message size and number
of flows, UDP packet rate vs datagram size, latency, and the memcached and nginx applications,
each on the native path, the Linux overlay (a VXLAN device in the host namespace, no
containers), the docker overlay and the flannel overlay, with per-CPU breakdowns, softirq and
interrupt counts and per-stage CPU placement. The full study sweeps TCP messages 16 B-64 KiB and
1-80 flows (flows share one client/server pair, and on a small machine the cores; the report
says so). --quick finishes in under 5 minutes.
Same as "peregrine bench suite study".`
	c.Example = `  peregrine bench study --quick
  peregrine bench study --out results/study-$(date +%F)`
	c.Args = cobra.NoArgs
	run := c.RunE
	c.RunE = func(cmd *cobra.Command, _ []string) error { return run(cmd, []string{"study"}) }
	return c
}

func newBenchSuiteCmd() *cobra.Command {
	var b benchFlags
	var quick bool
	c := &cobra.Command{
		Use:   "suite NAME",
		Short: "Run a paper's set of experiments (several scenarios and configs) and write one HTML report",
		Long: `A suite is a list of steps, each a scenario with the configurations it compares (native
first: every ratio is against the native path), run in turn into one result file per step,
then one HTML report over all of them.

Suites:
` + suite.Help(),
		Example: `  peregrine bench suite falcon --quick
  peregrine bench suite study --out results/study
  peregrine bench suite fastpath               # issue 29's targets, scored: prints the scorecard, writes scorecard.json
  peregrine bench suite fastpath-real --quick  # the same on real flannel, short
  peregrine bench suite fastpath-k8s           # on the Kubernetes lab that is up (lab up --style k8s --no-agent)`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			b.duration, b.reps = time.Second, 1 // each step brings its own
			o, err := b.options(nil, "tcp")
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			runs, _, err := suite.Run(ctx, args[0], quick, o)
			if len(runs) > 0 {
				if terr := report.Table(os.Stdout, runs...); terr != nil {
					fmt.Fprintln(os.Stderr, terr)
				}
				if ts := suite.Targets(args[0]); ts != nil {
					scoreSuite(ts, runs, b.out, b.asJSON)
				}
				if !b.noReport {
					idx, rerr := report.HTML(filepath.Join(b.out, "report"), runs)
					if rerr != nil {
						fmt.Fprintf(os.Stderr, "report: %v\n", rerr)
					} else {
						fmt.Fprintf(os.Stderr, "\nreport: %s\n", idx)
					}
				}
			}
			return err
		},
	}
	b.add(c, false)
	c.Flags().BoolVar(&quick, "quick", false, "short variant: fewer points, 2 s measurements, 2 repetitions")
	return c
}

// scorecardFile is the scorecard's name in a suite's --out folder (readRuns skips it).
const scorecardFile = "scorecard.json"

// scoreSuite prints a suite's scorecard (a table, or JSON with --json) and writes it to
// DIR/scorecard.json beside the results.
func scoreSuite(ts []suite.Target, runs []*results.Run, dir string, asJSON bool) {
	scores := suite.Scorecard(ts, runs)
	fmt.Println()
	if asJSON {
		_ = suite.EncodeScorecard(os.Stdout, scores)
	} else if err := suite.WriteScorecard(os.Stdout, scores); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	path := filepath.Join(dir, scorecardFile)
	if err := suite.SaveScorecard(path, scores); err != nil {
		fmt.Fprintf(os.Stderr, "scorecard: %v\n", err)
	} else {
		fmt.Fprintf(os.Stderr, "scorecard: %s\n", path)
	}
}

// runBench runs one scenario, prints the table (or JSON) and writes the report.
func runBench(o bench.Options, b *benchFlags) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fmt.Fprintf(os.Stderr, "bench %s: %d configs, about %s of measuring\n", o.Scenario.Name, len(o.Configs),
		o.Scenario.EstimatedDuration(len(o.Configs)).Round(time.Second))
	run, path, err := bench.Run(ctx, o)
	if run == nil {
		return err
	}
	if b.asJSON {
		if jerr := run.Encode(os.Stdout); jerr != nil {
			return jerr
		}
	} else if terr := report.Table(os.Stdout, run); terr != nil {
		fmt.Fprintln(os.Stderr, terr)
	}
	if path != "" {
		fmt.Fprintf(os.Stderr, "result: %s\n", path)
	}
	if !b.noReport && path != "" {
		idx, rerr := report.HTML(filepath.Join(o.OutDir, "report-"+run.ID), []*results.Run{run})
		if rerr == nil {
			fmt.Fprintf(os.Stderr, "report: %s\n", idx)
		}
	}
	return err
}

func newBenchProjectCmd() *cobra.Command {
	var cores string
	var against []string
	var asJSON bool
	c := &cobra.Command{
		Use:   "project RESULT.json|DIR...",
		Short: "Model what a machine with more cores would do, from the per-stage costs a run measured",
		Long: `A model, not a measurement. From each point's measured NET_RX ns per packet per receive
stage (the stage probe) and each config's CPU placement class (recorded in the result from what
its modes declare), it projects the receive capacity at each core count. It first checks itself
against the machine the run was measured on (each CPU's free time over its stages' cost, the
scarcest CPU setting the rate) and prints the error where the point was receive-bound. Run a rate
sweep up to saturation for a meaningful check. A file written before placement classes were
recorded gets them from this build's modes, with a note.

Placement classes:
` + bench.PlacementHelp(),
		Example: `  peregrine bench project results/udp-inject-*.json --cores 1,2,4,8,16
  peregrine bench project r2/ --against 4=r4/ --against 16=r16/   # the model from r2's costs vs runs at 4 and 16 CPUs
  peregrine bench run udp-inject --configs native,docker,docker/falcon --rates 100000,0 --out r && peregrine bench project r`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cs, err := parseIntList(cores)
			if err != nil {
				return fmt.Errorf("--cores: %w", err)
			}
			for _, n := range cs {
				if n < 1 || n > 4096 {
					return fmt.Errorf("--cores: %d out of range 1..4096", n)
				}
			}
			runs, err := readRuns(args)
			if err != nil {
				return err
			}
			for _, n := range bench.FillPlacements(runs...) {
				fmt.Fprintln(os.Stderr, "note: "+n)
			}
			if len(against) > 0 {
				at, err := againstRuns(against)
				if err != nil {
					return err
				}
				rows := report.ModelCheck(runs, at)
				if asJSON {
					return report.WriteModelCheckJSON(os.Stdout, rows)
				}
				return report.WriteModelCheck(os.Stdout, rows)
			}
			if asJSON {
				return fmt.Errorf("--json goes with --against (the model-vs-measured rows); the projection alone is a table")
			}
			return report.Project(os.Stdout, cs, runs...)
		},
	}
	c.Flags().StringVar(&cores, "cores", "1,2,4,8,16", "receive core counts to project to")
	c.Flags().StringArrayVar(&against, "against", nil, "N=RESULT.json|DIR: a run measured with N CPUs (bench --mode-cpus); prints the model's prediction at N from the given runs' stage costs next to what it measured, with the error (repeatable; --cores is then ignored)")
	c.Flags().BoolVar(&asJSON, "json", false, "with --against: the rows as JSON")
	return c
}

// againstRuns reads --against N=PATH values into runs by N.
func againstRuns(vals []string) (map[int][]*results.Run, error) {
	at := map[int][]*results.Run{}
	for _, v := range vals {
		ns, path, ok := strings.Cut(v, "=")
		n, err := strconv.Atoi(ns)
		if !ok || err != nil || n < 1 || n > 4096 || path == "" {
			return nil, fmt.Errorf("--against %q: want N=RESULT.json or N=DIR with N the CPU count the run had (1..4096), e.g. --against 16=r16/", v)
		}
		runs, err := readRuns([]string{path})
		if err != nil {
			return nil, fmt.Errorf("--against %s: %w", v, err)
		}
		bench.FillPlacements(runs...)
		at[n] = append(at[n], runs...)
	}
	return at, nil
}

// readRuns reads result files, or every *.json in the directories given.
func readRuns(args []string) ([]*results.Run, error) {
	var files []string
	for _, a := range args {
		if st, err := os.Stat(a); err == nil && st.IsDir() {
			m, _ := filepath.Glob(filepath.Join(a, "*.json"))
			for _, f := range m {
				if filepath.Base(f) != scorecardFile { // a suite's scorecard, beside its results
					files = append(files, f)
				}
			}
		} else {
			files = append(files, a)
		}
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no result files (*.json) in %s", strings.Join(args, " "))
	}
	var runs []*results.Run
	for _, f := range files {
		r, err := results.Read(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		runs = append(runs, r)
	}
	return runs, nil
}

func newBenchScoreCmd() *cobra.Command {
	var asJSON bool
	var out string
	c := &cobra.Command{
		Use:   "score SUITE RESULT.json|DIR...",
		Short: "Score saved results of a suite against its targets again (the scorecard `bench suite` prints)",
		Long: `A suite with targets (fastpath, fastpath-real, fastpath-k8s) ends with a scorecard: each target's ratio, median
of interleaved repetitions in one run, its range over the pairs, and whether it is met. score
reads saved result files (a suite's --out folder, or files of its steps) and prints the
scorecard again, e.g. after a run was interrupted or to compare two runs' folders. A step is
found by its title (the result's first note); targets whose step is missing say so.`,
		Example: `  peregrine bench score fastpath results/             # every *.json in the suite's --out folder
  peregrine bench score fastpath-real /tmp/rf --json`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ts := suite.Targets(args[0])
			if ts == nil {
				return fmt.Errorf("suite %q has no targets to score: suites with targets are %s", args[0], strings.Join(suite.TargetSuites(), ", "))
			}
			runs, err := readRuns(args[1:])
			if err != nil {
				return err
			}
			if out == "" {
				out = os.TempDir()
			}
			scoreSuite(ts, runs, out, asJSON)
			return nil
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print the scorecard as JSON instead of a table")
	c.Flags().StringVar(&out, "out", "", "directory to write scorecard.json into (default: the system's temporary directory)")
	return c
}

func newReportCmd() *cobra.Command {
	var out string
	c := &cobra.Command{
		Use:   "report RESULT.json|DIR...",
		Short: "Turn result files into a self-contained HTML report with plots, and print the table",
		Example: `  peregrine report results/                       # every *.json in the folder
  peregrine report results/tcp-*.json --out /tmp/rep`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			runs, err := readRuns(args)
			if err != nil {
				return err
			}
			if err := report.Table(os.Stdout, runs...); err != nil {
				return err
			}
			idx, err := report.HTML(out, runs)
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "report: %s (%d runs)\n", idx, len(runs))
			return nil
		},
	}
	c.Flags().StringVar(&out, "out", "results/report", "directory to write index.html and the plots into")
	return c
}

func parseIntList(s string) ([]int, error) {
	var out []int
	for _, p := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil {
			return nil, fmt.Errorf("%q is not a list of integers like 16,64,1024", s)
		}
		out = append(out, v)
	}
	return out, nil
}

// modeOptions reads --mode-opt KEY=VALUE pairs; each must be declared by a mode of the run (a
// suite's configs are checked when its steps run) and parse there.
func modeOptions(pairs []string, configs []bench.Config) (map[string]string, error) {
	if len(pairs) == 0 {
		return nil, nil
	}
	m := map[string]string{}
	for _, kv := range pairs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--mode-opt %q: want KEY=VALUE", kv)
		}
		m[strings.ReplaceAll(k, "-", "_")] = v
	}
	for k, v := range m {
		declared := len(configs) == 0
		for _, c := range configs {
			for _, spec := range c.Stack {
				if got := datapath.FilterOptions(spec.Mode, map[string]string{k: v}); len(got) == 1 {
					if err := datapath.CheckOptions(spec.Mode, got); err != nil {
						return nil, fmt.Errorf("--mode-opt: %w", err)
					}
					declared = true
				}
			}
		}
		if !declared {
			return nil, fmt.Errorf("--mode-opt %s: no mode of this run declares option %s (see `peregrine options MODE`)", k, k)
		}
	}
	return m, nil
}
