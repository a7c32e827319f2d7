package report

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/peregrine-net/peregrine/internal/results"
	"github.com/peregrine-net/peregrine/internal/results/format"
)

// The projection answers "what would a bigger machine do" from what a small one measured. It is
// a model, not a measurement: each stage's NET_RX ns per delivered packet (the stage probe's
// attribution) is taken as fixed, and each config's placement class (results.Placement, recorded
// by the bench from what its modes declare) says how one flow's stages may be spread over cores. A flow's rate is 1e9 over its busiest core's ns per packet; all flows
// together cannot exceed the receive cores' total time over the summed stage cost. The receiving
// application is assumed to have cores of its own (--cores counts receive cores only), and
// hash collisions, cache effects and cross-core handoff costs beyond those measured are ignored.

// satBusy is the bottleneck CPU's busy share from which a point counts as receive-bound.
const satBusy = 0.9

// projPoint is one (config, x) of a run, reduced to what the model needs.
type projPoint struct {
	run      *results.Run
	config   string
	class    results.Placement
	x        map[string]float64
	flows    int
	stageNs  []float64 // per stage, in path order
	stages   []string
	measured float64 // delivered_pps median
	check    float64 // bottleneck-CPU prediction at the measured placement, packets/s
	checkCPU int
	sat      bool // the point was receive-bound (a CPU saturated or packets lost)
}

// stage path order for the model: the NIC stage first, then the later stages.
func stagePathOrder(names []string) []string {
	order := append(slices.Clone(stageOrder), "backlog")
	out := slices.Clone(names)
	slices.SortFunc(out, func(a, b string) int {
		ia, ib := slices.Index(order, a), slices.Index(order, b)
		if ia < 0 {
			ia = len(order)
		}
		if ib < 0 {
			ib = len(order)
		}
		if ia != ib {
			return ia - ib
		}
		return strings.Compare(a, b)
	})
	return out
}

// projPoints extracts every point with stage costs and a delivered rate.
func projPoints(run *results.Run) []projPoint {
	class := map[string]results.Placement{}
	for _, c := range run.Configs {
		class[c.Name] = c.Placement
	}
	var out []projPoint
	for i := range run.Points {
		p := &run.Points[i]
		reps := p.MeasuredReps()
		if len(reps) == 0 {
			continue
		}
		pp := projPoint{run: run, config: p.Config, class: class[p.Config], x: p.X, flows: max(1, int(p.X["flows"]))}
		// Per stage and per CPU ns per delivered packet, and CPU busy shares, averaged over reps.
		stageNs := map[string]float64{}
		cpuStage := map[int]float64{}
		cpuBusy := map[int]float64{}
		var pps float64
		n := 0
		for _, r := range reps {
			pk, _ := results.DeliveredPackets(r, results.CostInput{})
			secs := r.Duration.Seconds()
			if pk <= 0 || secs <= 0 || len(r.Stages) == 0 {
				continue
			}
			n++
			if v, ok := r.Metrics[results.MetricDeliveredPPS]; ok && v > 0 {
				pps += v // over the workload's own interval, not the rep's (which includes setup)
			} else {
				pps += pk / secs
			}
			for _, s := range r.Stages {
				stageNs[s.Stage] += float64(s.SoftirqNs) / pk
				cpuStage[s.CPU] += float64(s.SoftirqNs) / pk
			}
			for _, c := range r.CPU {
				cpuBusy[c.CPU] += c.Busy()
			}
		}
		if n == 0 {
			continue
		}
		fn := float64(n)
		pp.measured = pps / fn
		var names []string
		for s := range stageNs {
			names = append(names, s)
		}
		pp.stages = stagePathOrder(names)
		for _, s := range pp.stages {
			pp.stageNs = append(pp.stageNs, stageNs[s]/fn)
		}
		// Check: each CPU gives its stages the time it did not spend on anything else; the
		// CPU that runs out first sets the rate.
		pp.check, pp.checkCPU = math.Inf(1), -1
		checkBusy := 0.0
		for cpu, ns := range cpuStage {
			ns /= fn
			busy := cpuBusy[cpu] / fn
			if ns < 50 { // a CPU with no real share of the path does not bound it
				continue
			}
			recvShare := ns * pp.measured / 1e9
			free := 1 - max(0, busy-recvShare)
			if r := free * 1e9 / ns; r < pp.check {
				pp.check, pp.checkCPU, checkBusy = r, cpu, busy
			}
		}
		// Only a point whose bottleneck CPU was (nearly) full tests the model: below that, the
		// capacity is above what was offered, by construction.
		pp.sat = checkBusy >= satBusy
		out = append(out, pp)
	}
	return out
}

// flowRate is one flow's rate on `cores` receive cores under the placement class, and the
// work-conserving bound of all cores; both packets/s. A class the model does not know (unknown,
// absent in an older file) is modelled as one core: projectNotes says so.
func flowRate(class results.Placement, ns []float64, cores int) (perFlow, total float64) {
	sum := 0.0
	for _, v := range ns {
		sum += v
	}
	if sum <= 0 || cores < 1 {
		return 0, 0
	}
	total = float64(cores) * 1e9 / sum
	nic, rest := ns[0], sum-ns[0]
	worst := sum // one flow, one core
	switch class {
	case results.PlacementSplitAfterNIC:
		if cores > 1 {
			worst = max(nic, rest/float64(cores-1))
		}
	case results.PlacementStagePerCore:
		// The best split of the path into at most `cores` consecutive groups.
		worst = minMaxPartition(ns, cores)
	case results.PlacementSecondCore:
		if cores > 1 {
			worst = max(nic, rest)
		}
	}
	return 1e9 / worst, total
}

// projectNotes names the configs of a run whose class the model does not know, so that their
// one-core projection is not taken for a declared one.
func projectNotes(run *results.Run) []string {
	var out []string
	for _, c := range run.Configs {
		switch {
		case c.Placement == "":
			out = append(out, fmt.Sprintf("%s: the file records no placement class (written before it was): modelled as one core", c.Name))
		case !c.Placement.Known():
			out = append(out, fmt.Sprintf("%s: placement %s", c.Name, c.Placement.Describe()))
		}
	}
	return out
}

// minMaxPartition splits xs into at most k consecutive groups minimizing the largest sum.
func minMaxPartition(xs []float64, k int) float64 {
	n := len(xs)
	k = min(k, n)
	// best[j][i]: min over splits of xs[:i] into j groups of the largest group sum.
	best := make([][]float64, k+1)
	for j := range best {
		best[j] = make([]float64, n+1)
		for i := range best[j] {
			best[j][i] = math.Inf(1)
		}
	}
	best[0][0] = 0
	for j := 1; j <= k; j++ {
		for i := 1; i <= n; i++ {
			s := 0.0
			for m := i; m >= 1; m-- {
				s += xs[m-1]
				best[j][i] = min(best[j][i], max(best[j-1][m-1], s))
			}
		}
	}
	res := math.Inf(1)
	for j := 1; j <= k; j++ {
		res = min(res, best[j][n])
	}
	return res
}

// Projection is the modelled receive capacity of one point at each core count.
func projectRate(pp projPoint, cores int) float64 {
	perFlow, total := flowRate(pp.class, pp.stageNs, cores)
	return min(float64(pp.flows)*perFlow, total)
}

// Project writes the model's table for every run: the measured per-stage costs, the check of
// the model against what was measured (the bottleneck CPU's prediction at the measured
// placement vs the delivered rate, error where the point was receive-bound), and the projected
// receive capacity at each core count.
func Project(w io.Writer, cores []int, runs ...*results.Run) error {
	fmt.Fprintln(w, "MODEL, not a measurement: receive capacity projected from measured per-stage NET_RX ns per packet and each config's")
	fmt.Fprintln(w, "  placement class, which says where one flow's stages may run:")
	fmt.Fprint(w, results.PlacementLegend("    "))
	fmt.Fprintln(w, "  All flows together are bounded by cores x 1e9 / summed stage ns. Cores count receive cores; the application is")
	fmt.Fprintln(w, "  assumed to have its own.")
	fmt.Fprintln(w, "  CHECK is the model at the measured placement (each CPU's free time over its stages' ns, the scarcest CPU wins);")
	fmt.Fprintln(w, "  ERR compares it with the measured rate where the point was receive-bound (its bottleneck CPU >= 90% busy).")
	var errs []float64
	for _, run := range runs {
		pts := projPoints(run)
		if len(pts) == 0 {
			fmt.Fprintf(w, "\nrun %s: no points with stage costs (run with the stage probe)\n", run.ID)
			continue
		}
		fmt.Fprintf(w, "\nrun %s: %s, measured on %d CPUs\n", run.ID, run.Scenario.Name, run.Env.CPUs)
		for _, n := range projectNotes(run) {
			fmt.Fprintln(w, "note: "+n)
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		head := []string{"CONFIG", "PLACEMENT", "AT", "STAGE NS/PKT", "MEASURED", "CHECK", "ERR"}
		for _, c := range cores {
			head = append(head, fmt.Sprintf("%d CORES", c))
		}
		fmt.Fprintln(tw, strings.Join(head, "\t"))
		for _, pp := range pts {
			var st []string
			for i, s := range pp.stages {
				st = append(st, fmt.Sprintf("%s %.0f", s, pp.stageNs[i]))
			}
			check, errTxt := "-", "-"
			if !math.IsInf(pp.check, 1) {
				check = format.Value("x_pps", pp.check) + fmt.Sprintf(" (cpu%d)", pp.checkCPU)
				if pp.sat {
					e := (pp.check - pp.measured) / pp.measured
					errs = append(errs, math.Abs(e))
					errTxt = fmt.Sprintf("%+.0f%%", 100*e)
				} else {
					errTxt = "not bound"
				}
			}
			row := []string{pp.config, placementCell(pp.class), results.XKey(pp.x), strings.Join(st, " "), format.Value("x_pps", pp.measured), check, errTxt}
			for _, c := range cores {
				row = append(row, format.Value("x_pps", projectRate(pp, c)))
			}
			fmt.Fprintln(tw, strings.Join(row, "\t"))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(errs) > 0 {
		slices.Sort(errs)
		fmt.Fprintf(w, "\nmodel check on this machine: median |error| %.0f%%, worst %.0f%% over %d receive-bound points\n",
			100*errs[len(errs)/2], 100*errs[len(errs)-1], len(errs))
	}
	return nil
}

// placementCell is a point's class in the table; "-" for a file without one.
func placementCell(p results.Placement) string {
	if p == "" {
		return "-"
	}
	return string(p)
}
