package report

import (
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"

	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/peregrine-net/peregrine/internal/results"
	"github.com/peregrine-net/peregrine/internal/results/format"
)

// costColumns are the per-packet cost figures of the cost table, in order.
var costColumns = []struct{ metric, title string }{
	{results.MetricCostCPU, "CPU"},
	{results.MetricCostReceive, "RECEIVE"},
	{results.MetricCostIRQCPU, "IRQ CPU"},
	{results.MetricCostSender, "SENDER"},
	{results.MetricCostBPF, "BPF"},
	{results.MetricCostProbe, "PROBE"},
	{results.MetricCPUPerGbps, "CORES/GBPS"},
}

const costLegend = "CPU = all CPUs' busy time per delivered packet (sender included); RECEIVE = NET_RX softirq charged to this path's devices, every stage; " +
	"IRQ CPU = the IRQ CPUs' busy time; SENDER = the injector's own CPU per sent packet; " +
	"BPF = the datapath's eBPF programs, net of the calibration program; PROBE = the stage probe's programs"

// hasCost reports whether any point carries cost figures.
func hasCost(v *view) bool {
	for _, pv := range v.points {
		if _, ok := pv.sum[results.MetricCostCPU]; ok {
			return true
		}
		if _, ok := pv.sum[results.MetricCostReceive]; ok {
			return true
		}
	}
	return false
}

// costHead and costRow build the cost table shared by the terminal and the HTML report.
func costHead(v *view) []string {
	head := []string{"CONFIG"}
	for _, k := range v.varying {
		head = append(head, strings.ToUpper(k))
	}
	for _, c := range costColumns {
		head = append(head, c.title)
	}
	if len(v.configs) > 1 {
		head = append(head, "RECEIVE VS "+v.baseline)
	}
	return head
}

func costRow(v *view, pv pointView) []string {
	row := []string{pv.p.Config}
	for _, k := range v.varying {
		row = append(row, xnum(pv.p.X[k]))
	}
	for _, c := range costColumns {
		if st, ok := pv.sum[c.metric]; ok {
			row = append(row, formatStat(c.metric, st))
		} else {
			row = append(row, "-")
		}
	}
	if len(v.configs) > 1 {
		cell := "-"
		if pv.p.Config == v.baseline {
			cell = "(baseline)"
		} else if r, ok := v.ratio(results.MetricCostReceive, pv.p); ok {
			cell = formatRatio(r) + " " + changeWord(r)
		}
		row = append(row, cell)
	}
	return row
}

// programLine lists a point's eBPF programs by role as "name NET ns x RUNS/pkt" from medians.
func programLine(pv pointView, roles []string) string {
	byRole := programRoles(pv.p)
	var parts []string
	for _, role := range roles {
		for _, name := range byRole[role] {
			st, ok := pv.sum[results.ProgramRunMetric(name)]
			if !ok {
				continue
			}
			runs := pv.sum[results.ProgramRunsMetric(name)]
			parts = append(parts, fmt.Sprintf("%s %s x%.2f", name, format.Num(st.Median)+" ns", runs.Median))
		}
	}
	if st, ok := pv.sum[results.MetricBPFCalibration]; ok && len(parts) > 0 {
		parts = append(parts, fmt.Sprintf("(calibration %s ns gross)", format.Num(st.Median)))
	}
	return strings.Join(parts, ", ")
}

// programRoles are the program names of a point's measured reps, by role, sorted.
func programRoles(p *results.Point) map[string][]string {
	out := map[string][]string{}
	for _, r := range p.MeasuredReps() {
		for _, pr := range r.Programs {
			if !slices.Contains(out[pr.Role], pr.Name) {
				out[pr.Role] = append(out[pr.Role], pr.Name)
			}
		}
	}
	for _, names := range out {
		sort.Strings(names)
	}
	return out
}

// costTable writes the cost block under a run's table.
func costTable(w io.Writer, v *view) error {
	if !hasCost(v) {
		return nil
	}
	fmt.Fprintf(w, "\ncost per delivered packet (median [min–max]): %s\n", costLegend)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(costHead(v), "\t"))
	for _, pv := range v.points {
		fmt.Fprintln(tw, strings.Join(costRow(v, pv), "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	first := true
	for _, pv := range v.points {
		line := programLine(pv, []string{results.RoleDatapath, results.RoleSender})
		if line == "" {
			continue
		}
		if first {
			fmt.Fprintln(w, "eBPF programs (net ns per run x runs per delivered packet):")
			first = false
		}
		fmt.Fprintf(w, "  %s %s: %s\n", pv.p.Config, results.XKey(pv.p.X), line)
	}
	return nil
}

// costParts are the stacked segments of the cost chart: every stage in path order, then the
// NET_RX time no stage got, then everything outside NET_RX. They add up to cost_cpu_ns.
func costParts(v *view) []string {
	var stages []string
	for _, pv := range v.points {
		for m := range pv.sum {
			if strings.HasPrefix(m, "cost_stage_") && !slices.Contains(stages, m) {
				stages = append(stages, m)
			}
		}
	}
	rank := func(m string) int {
		st := strings.TrimSuffix(strings.TrimPrefix(m, "cost_stage_"), "_ns")
		for i, s := range append(slices.Clone(stageOrder), "backlog") {
			if strings.ReplaceAll(s, "-", "_") == st {
				return i
			}
		}
		return len(stageOrder) + 1
	}
	slices.SortFunc(stages, func(a, b string) int {
		if ra, rb := rank(a), rank(b); ra != rb {
			return ra - rb
		}
		return strings.Compare(a, b)
	})
	return append(stages, results.MetricCostUnattributed, results.MetricCostOther)
}

func partLabel(m string) string {
	switch m {
	case results.MetricCostUnattributed:
		return "NET_RX, no stage"
	case results.MetricCostOther:
		return "outside NET_RX (sender, app, syscalls)"
	}
	return strings.ReplaceAll(strings.TrimSuffix(strings.TrimPrefix(m, "cost_stage_"), "_ns"), "_", "-") + " stage"
}

// costStack draws where each config's nanoseconds per delivered packet go: one bar per point,
// stacked by stage, the unattributed NET_RX time and the rest. Nil without cost data.
func costStack(v *view) (*chart, error) {
	if !hasCost(v) {
		return nil, nil
	}
	parts := costParts(v)
	var names []string
	var cols []pointView
	for _, pv := range v.points {
		if _, ok := pv.sum[results.MetricCostCPU]; !ok {
			continue
		}
		name := pv.p.Config
		if len(v.varying) > 0 {
			var xs []string
			for _, k := range v.varying {
				xs = append(xs, k+"="+xnum(pv.p.X[k]))
			}
			name += "\n" + strings.Join(xs, " ")
		}
		names = append(names, name)
		cols = append(cols, pv)
	}
	if len(cols) == 0 {
		return nil, nil
	}
	maxY := 0.0
	for _, pv := range cols {
		maxY = max(maxY, pv.sum[results.MetricCostCPU].Median)
	}
	sc := format.For(results.MetricCostCPU, maxY)
	ch := &chart{p: newPlot("where each config's CPU time per delivered packet goes", "config", "CPU time per delivered packet ("+sc.Name+")")}
	ch.p.Add(hGrid())
	width := min(ch.dataWidth()/vg.Length(len(cols)+1)*0.45, vg.Points(60))
	var below *plotter.BarChart
	for i, m := range parts {
		vals := make(plotter.Values, len(cols))
		any := false
		for j, pv := range cols {
			if st, ok := pv.sum[m]; ok {
				vals[j] = st.Median / sc.Div
				any = any || st.Median > 0
			}
		}
		if !any {
			continue
		}
		var err error
		if below, err = ch.stackBar(vals, width, i, partLabel(m), below); err != nil {
			return nil, fmt.Errorf("cost plot: %w", err)
		}
	}
	slices.Reverse(ch.legend)
	ch.p.NominalX(names...)
	if len(names) > 4 { // long config names side by side would overlap
		ch.p.X.Tick.Label.Rotation = math.Pi / 6
		ch.p.X.Tick.Label.XAlign = draw.XRight
		ch.p.X.Tick.Label.YAlign = draw.YCenter
	}
	ch.p.Y.Min = 0
	return ch, nil
}

// costHTML is the cost table and the program rows of the HTML report.
func costHTML(v *view) (htmlTable, htmlTable) {
	if !hasCost(v) {
		return htmlTable{}, htmlTable{}
	}
	t := htmlTable{Head: costHead(v)}
	for _, pv := range v.points {
		t.Rows = append(t.Rows, costRow(v, pv))
	}
	progs := htmlTable{Head: []string{"config", "at", "program", "role", "net ns per run", "runs per packet", "net ns per packet"}}
	for _, pv := range v.points {
		byRole := programRoles(pv.p)
		for _, role := range []string{results.RoleDatapath, results.RoleSender, results.RoleProbe} {
			for _, name := range byRole[role] {
				st, ok := pv.sum[results.ProgramRunMetric(name)]
				if !ok {
					continue
				}
				runs := pv.sum[results.ProgramRunsMetric(name)]
				progs.Rows = append(progs.Rows, []string{pv.p.Config, results.XKey(pv.p.X), name, role,
					formatStat(results.ProgramRunMetric(name), st), fmt.Sprintf("%.2f", runs.Median),
					format.Value("x_ns", st.Median*runs.Median)})
			}
		}
		if st, ok := pv.sum[results.MetricBPFCalibration]; ok {
			progs.Rows = append(progs.Rows, []string{pv.p.Config, results.XKey(pv.p.X), "prg_cost_calib", results.RoleCalibration,
				formatStat(results.MetricBPFCalibration, st) + " (gross)", "", ""})
		}
	}
	return t, progs
}
