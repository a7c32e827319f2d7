// Package suite holds the papers' experiment sets: lists of steps, each a scenario with the
// configs it compares, run one after the other by the bench runner into one result file each.
package suite

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/peregrine-net/peregrine/internal/bench"
	"github.com/peregrine-net/peregrine/internal/results"
)

// Step is one scenario of a suite with the configs it compares (the first is the baseline).
type Step struct {
	Title    string
	Scenario bench.Scenario
	Configs  []string
}

// suites are the papers' experiment sets at this machine's scale. Each returns its steps;
// quick shortens them (fewer points, 2 s, 2 repetitions).
var suites = map[string]struct {
	help    string
	steps   func(quick bool) []Step
	targets func() []Target // scored after the run (Scorecard); nil: none
}{
	"study":  {"the characterization study (dissertation ch. 2): native vs Linux overlay vs docker vs flannel", studySteps, nil},
	"falcon": {"FALCON's experiments: packet rate, TCP with/without GRO split, latency under/over load, flows, hotspot, threshold, CPU cost", falconSteps, nil},
	"mflow":  {"MFLOW's experiments: single-flow TCP/UDP by size, reordering vs batch size, device vs full-path splitting, latency, flows", mflowSteps, nil},
	"prism":  {"PRISM's experiments: HP ping-pong alone and under TCP/UDP bulk background, memcached as HP under bulk", prismSteps, nil},
	"fastpath": {"the node-scale fast path's scorecard on the flannel-style lab (what k8s-netperf reports): 1 and 32 TCP streams vs native and vanilla, CPU per packet, TCP_RR and TCP_CRR p50/p99, 100 000 flows; each ratio judged against its target",
		fastpathSteps("flannel"), func() []Target { return fastpathTargets("flannel") }},
	"fastpath-real": {"the same scorecard on real flannel (flannel's own flanneld and CNI plugin; scripts/setup.sh builds them)",
		fastpathSteps("real-flannel"), func() []Target { return fastpathTargets("real-flannel") }},
	"fastpath-k8s": {"the same scorecard on the real Kubernetes lab that is up (lab up --style k8s --no-agent): vanilla and fastpath between kubelet's pods of two nodes; no native baseline, no 100 000 flows",
		fastpathSteps(bench.StyleK8s), func() []Target { return fastpathTargets(bench.StyleK8s) }},
}

// Names lists the suites.
func Names() []string { return slices.Sorted(maps.Keys(suites)) }

// Help describes the suites, one per line.
func Help() string {
	var b strings.Builder
	for _, n := range Names() {
		fmt.Fprintf(&b, "  %-14s %s\n", n, suites[n].help)
	}
	return b.String()
}

// otherCPU is a CPU other than the IRQ core (CPU0): where a split or a hotspot goes.
func otherCPU() int {
	if runtime.NumCPU() > 1 {
		return runtime.NumCPU() - 1
	}
	return 0
}

func falconSteps(quick bool) []Step {
	d, reps, warm := 5*time.Second, 3, 1
	sizes, flows := []int{16, 64, 1024}, []int{1, 2, 4, 8}
	if quick {
		d, reps, warm = 2*time.Second, 2, 1
		sizes, flows = []int{64}, []int{1, 4}
	}
	sc := func(name string) bench.Scenario {
		return bench.Scenario{Name: name, Duration: d, Reps: reps, Warmup: warm}
	}
	split := "docker/falcon@split_cpus=" + strconv.Itoa(otherCPU())
	base := []string{"native", "docker", "docker/rps", "docker/falcon"}

	pkt := sc("udp-inject")
	pkt.Sizes = sizes
	tcp := sc("tcp")
	tcp.Sizes = []int{4096, 65536}
	if quick {
		tcp.Sizes = []int{65536}
	}
	under := sc("underload")
	under.Rate = 10000
	over := sc("underload")
	over.Rate = 200000
	multi := sc("udp-inject")
	multi.Sizes, multi.Flows = []int{64}, flows
	hot := sc("udp-inject")
	hot.Sizes, hot.Flows, hot.HogCPUs = []int{64}, []int{16}, []int{otherCPU()} // many flows: static placement averages out
	thr := sc("udp-inject")
	thr.Sizes, thr.Flows = []int{64}, []int{4}
	cost := sc("udp-inject")
	cost.Sizes, cost.Rate = []int{64}, 50000
	return []Step{
		{"single-flow UDP packet rate vs size", pkt, base},
		{"TCP throughput, with and without GRO split", tcp, append(append([]string{}, base...), split)},
		{"latency under load (10k msg/s)", under, []string{"native", "docker", "docker/falcon"}},
		{"latency over load (200k msg/s)", over, []string{"native", "docker", "docker/falcon"}},
		{"multi-flow UDP packet rate", multi, base},
		{fmt.Sprintf("static vs dynamic with CPU%d busy (hotspot)", otherCPU()), hot, []string{"native", "docker", "docker/falcon@static=true", "docker/falcon"}},
		{"threshold sweep", thr, []string{"native", "docker", "docker/falcon@threshold=50", "docker/falcon@threshold=80", "docker/falcon@threshold=100"}},
		{"CPU cost at a fixed 50 kpps", cost, base},
	}
}

func mflowSteps(quick bool) []Step {
	d, reps, warm := 5*time.Second, 3, 1
	tcpSizes, udpSizes, flows := []int{4096, 65536}, []int{16, 1024}, []int{1, 2, 4, 8}
	batches := []int{16, 64, 256, 1024}
	if quick {
		d, reps, warm = 2*time.Second, 2, 1
		tcpSizes, udpSizes, flows, batches = []int{65536}, []int{64}, []int{1, 4}, []int{16, 256}
	}
	sc := func(name string) bench.Scenario {
		return bench.Scenario{Name: name, Duration: d, Reps: reps, Warmup: warm}
	}
	modes := []string{"native", "docker", "docker/rps", "docker/falcon", "docker/mflow", "docker/mflow@split_at=device"}
	tcp := sc("tcp")
	tcp.Sizes = tcpSizes
	udp := sc("udp-inject")
	udp.Sizes = udpSizes
	reorder := sc("tcp")
	reorder.Sizes = []int{65536}
	// The batch sweep measures the split's own reordering (the paper's Fig. 4.9), so the reorder
	// guard, which would hold the flows that reorder, is off there; the guard step compares.
	batchCfgs := []string{"native", "docker"}
	for _, b := range batches {
		batchCfgs = append(batchCfgs, fmt.Sprintf("docker/mflow@batch=%d+reorder_guard=0", b))
	}
	guardCfgs := []string{"native", "docker", "docker/mflow@reorder_guard=0", "docker/mflow",
		"docker/mflow@split_at=device+reorder_guard=0", "docker/mflow@split_at=device"}
	seq := sc("udp-inject")
	seq.Sizes = []int{64}
	lat := sc("pingpong")
	multi := sc("udp-inject")
	multi.Sizes, multi.Flows = []int{64}, flows
	return []Step{
		{"single-flow TCP by message size", tcp, modes},
		{"single-flow UDP packet rate by size (sequence-checked)", udp, modes},
		{"reordering vs batch size, TCP 64 KB (the reordering and loss block)", reorder, batchCfgs},
		{"reorder guard off and on, TCP 64 KB", reorder, guardCfgs},
		{"reordering vs batch size, UDP 64 B (reordered_count)", seq, batchCfgs},
		{"latency (TCP ping-pong)", lat, modes},
		{"multi-flow UDP packet rate", multi, modes},
	}
}

func prismSteps(quick bool) []Step {
	d, reps, warm := 5*time.Second, 3, 1
	if quick {
		d, reps, warm = 2*time.Second, 2, 1
	}
	sc := func(name, bg string) bench.Scenario {
		return bench.Scenario{Name: name, Duration: d, Reps: reps, Warmup: warm, Background: bg}
	}
	cfgs := []string{"native", "docker", "docker/prism", "docker/prism@hp_cpus=" + strconv.Itoa(otherCPU()), "docker/falcon/prism"}
	// The latency application at real-time priority stands in for a core of its own (the papers'
	// setup): the tail then shows the network path's queueing, which is what PRISM removes,
	// rather than the CPU scheduler's. Flannel style, with prism over the fast path.
	rt := func(bg string) bench.Scenario {
		s := sc("pingpong", bg)
		s.HPRealTime = true
		return s
	}
	rtCfgs := []string{"native", "flannel", "flannel/prism", "flannel/fastpath", "flannel/fastpath/prism"}
	return []Step{
		{"HP ping-pong at real-time priority alone (flannel)", rt(""), rtCfgs},
		{"HP ping-pong at real-time priority under TCP bulk background (flannel)", rt("tcp"), rtCfgs},
		{"HP ping-pong alone", sc("pingpong", ""), cfgs},
		{"HP ping-pong under TCP bulk background", sc("pingpong", "tcp"), cfgs},
		{"HP ping-pong under UDP bulk background", sc("pingpong", "udp"), cfgs},
		{"memcached (HP) under TCP bulk background", sc("memcached", "tcp"), cfgs},
	}
}

// Duration estimates a suite's measuring time.
func Duration(name string, quick bool) time.Duration {
	var t time.Duration
	for _, st := range suites[name].steps(quick) {
		t += st.Scenario.EstimatedDuration(len(st.Configs))
	}
	return t
}

// Run runs every step of a suite, each into its own result file. Configs in base are
// replaced by each step's.
func Run(ctx context.Context, name string, quick bool, base bench.Options) ([]*results.Run, []string, error) {
	s, ok := suites[name]
	if !ok {
		return nil, nil, fmt.Errorf("unknown suite %q: choose one of %s", name, strings.Join(Names(), ", "))
	}
	steps := s.steps(quick)
	for _, st := range steps { // every config must parse before anything is built
		if _, err := bench.ParseConfigs(strings.Join(st.Configs, ",")); err != nil {
			return nil, nil, fmt.Errorf("suite %s, %s: %w", name, st.Title, err)
		}
	}
	base.Logf("suite %s: %d steps, about %s of measuring", name, len(steps), Duration(name, quick).Round(time.Second))
	var runs []*results.Run
	var paths []string
	var errs []error
	for i, st := range steps {
		o := base
		o.Scenario = st.Scenario
		if o.Scenario.Injector == "" {
			o.Scenario.Injector = base.Scenario.Injector
		}
		o.Configs, _ = bench.ParseConfigs(strings.Join(st.Configs, ","))
		o.Logf("\n== %s %d/%d: %s", name, i+1, len(steps), st.Title)
		run, path, err := bench.Run(ctx, o)
		if run != nil {
			run.Notes = append([]string{st.Title}, run.Notes...)
			if path != "" {
				_ = run.Write(path)
			}
			runs = append(runs, run)
		}
		if path != "" {
			paths = append(paths, path)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", st.Title, err))
			if ctx.Err() != nil {
				break
			}
		}
	}
	return runs, paths, errors.Join(errs...)
}
