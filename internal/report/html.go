package report

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/peregrine-net/peregrine/internal/results"
)

// IndexName is the report's entry page inside the output folder.
const IndexName = "index.html"

// HTML writes a self-contained report for the runs into outDir: index.html and one PNG per chart,
// referenced by relative name so the folder can be copied or served anywhere. Charts are drawn
// only where the runs have the data. It returns the path of index.html.
func HTML(outDir string, runs []*results.Run) (string, error) {
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return "", fmt.Errorf("report: %w", err)
	}
	page := pageData{Generated: time.Now().UTC().Format(time.RFC3339), Schema: results.Schema}
	for i, run := range runs {
		if run == nil {
			return "", fmt.Errorf("report: run %d is nil", i)
		}
		sec, err := buildSection(outDir, fmt.Sprintf("r%d", i+1), run)
		if err != nil {
			return "", fmt.Errorf("report: run %q: %w", run.ID, err)
		}
		page.Runs = append(page.Runs, sec)
	}
	var buf bytes.Buffer
	if err := pageTmpl.Execute(&buf, page); err != nil {
		return "", fmt.Errorf("report: render: %w", err)
	}
	index := filepath.Join(outDir, IndexName)
	if err := os.WriteFile(index, buf.Bytes(), 0o644); err != nil {
		return "", fmt.Errorf("report: %w", err)
	}
	return index, nil
}

type pageData struct {
	Generated string
	Schema    string
	Runs      []section
}

type section struct {
	Anchor     string
	Run        *results.Run
	Title      string
	Incomplete bool
	Facts      [][2]string // label, value: the header
	Configs    []configRow
	Offloads   *offloadTable
	Fixed      string
	Figures    []figure
	Table      htmlTable
	IRQs       htmlTable // NET_RX softirqs and interrupts per point
	IRQLegend  string
	Reorder    htmlTable // reordering counters per point
	ReorderLeg string
	FlowNote   string // how the run's flows share client/server pairs (results.FlowSharingNote)
	OtherLoad  string // other processes that ran during the reps (results.OtherLoadNote)
	Ratios     []ratioRow
	Baseline   string
	Stages     []stageTable
	Cost       htmlTable // cost per delivered packet
	Programs   htmlTable // eBPF programs' net ns per run
	Problems   []string  // Validate's findings, shown rather than hidden
}

type configRow struct {
	Name, Style, Mode, Placement, Knobs, Arrangement string
}

type figure struct {
	File, Caption string
}

type htmlTable struct {
	Head []string
	Rows [][]string
}

type ratioRow struct {
	Metric, X, Numerator, Ratio, Change string
	Better, Worse                       bool
}

type stageTable struct {
	Config string
	Rows   []stageRow
}

type stageRow struct {
	Stage, CPU, Packets, Share, NsPerPkt, Devices string
}

func buildSection(outDir, prefix string, run *results.Run) (section, error) {
	v := newView(run)
	s := section{Anchor: prefix, Run: run, Incomplete: !run.Complete, Baseline: v.baseline}
	s.Title = run.Scenario.Name
	if s.Title == "" {
		s.Title = run.ID
	}
	s.Facts = facts(run)
	for _, c := range run.Configs {
		row := configRow{Name: c.Name, Style: c.Style, Mode: c.Mode, Placement: placementCell(c.Placement)}
		var knobs []string
		for _, k := range slices.Sorted(maps.Keys(c.Knobs)) {
			knobs = append(knobs, k+"="+c.Knobs[k])
		}
		row.Knobs = strings.Join(knobs, ", ")
		if c.Arrangement != nil {
			row.Arrangement = arrangementText(*c.Arrangement)
		} else {
			row.Arrangement = "(run's)"
		}
		s.Configs = append(s.Configs, row)
	}
	s.Offloads = buildOffloads(run.Configs)
	if len(v.fixed) > 0 {
		s.Fixed = results.XKey(v.fixed)
	}
	for _, e := range run.Validate() {
		s.Problems = append(s.Problems, e.Error())
	}
	figs, err := drawFigures(outDir, prefix, v)
	if err != nil {
		return s, err
	}
	s.Figures = figs
	s.Table = pointsTable(v)
	s.IRQs, s.IRQLegend = irqTable(v), irqLegend
	s.Reorder, s.ReorderLeg = reorderTable(v, xTitle), reorderLegend
	s.FlowNote = results.FlowSharingNote(run)
	s.OtherLoad = results.OtherLoadNote(run)
	for _, r := range v.sortedRatios() {
		change := changeWord(r)
		s.Ratios = append(s.Ratios, ratioRow{
			Metric: metricTitle(r.Metric), X: results.XKey(r.X), Numerator: r.Numerator,
			Ratio: formatRatio(r), Change: change,
			Better: strings.HasSuffix(change, "better"), Worse: strings.HasSuffix(change, "worse"),
		})
	}
	s.Stages = stageTables(v)
	s.Cost, s.Programs = costHTML(v)
	return s, nil
}

func facts(run *results.Run) [][2]string {
	var f [][2]string
	add := func(k, v string) {
		if v != "" {
			f = append(f, [2]string{k, v})
		}
	}
	add("run", run.ID)
	add("workload", run.Scenario.Workload)
	when := run.Started.UTC().Format("2006-01-02 15:04:05 UTC")
	if !run.Finished.IsZero() {
		when += fmt.Sprintf(" (%s)", run.Finished.Sub(run.Started).Round(time.Second))
	}
	add("started", when)
	add("kernel", run.Env.Kernel)
	cpus := fmt.Sprint(run.Env.CPUs)
	if run.Env.CPUModel != "" {
		cpus += " × " + run.Env.CPUModel
	}
	add("CPUs", cpus)
	add("host", strings.TrimSpace(run.Env.Hostname+" "+paren(run.Env.Virtualized)))
	add("lab", labText(run.Lab))
	add("arrangement", arrangementText(run.Arrangement))
	sc := run.Scenario
	reps := fmt.Sprintf("%d measured + %d warm-up", sc.Repetitions, sc.Warmup)
	if sc.Interleaved {
		reps += ", interleaved across configs (ratio spread from paired reps)"
	}
	add("repetitions", reps)
	var params []string
	for _, k := range slices.Sorted(maps.Keys(sc.Params)) {
		params = append(params, fmt.Sprintf("%s=%v", k, sc.Params[k]))
	}
	add("parameters", strings.Join(params, ", "))
	add("versions", strings.TrimSpace(joinNonEmpty(" · ", prefixed("peregrine ", run.Env.PeregrineVersion), run.Env.GoVersion)))
	return f
}

func labText(l results.Lab) string {
	if l.Hosts == 0 && len(l.Styles) == 0 {
		return ""
	}
	s := fmt.Sprintf("%s; %d hosts × %d containers; %s underlay, MTU %d", strings.Join(l.Styles, "+"),
		l.Hosts, l.Containers, orDash(l.Underlay), l.MTU)
	if len(l.RxCPUs) > 0 {
		s += "; underlay receive pinned to CPU " + cpuList(l.RxCPUs)
	} else {
		s += "; underlay receive on the sender's CPU"
	}
	return s
}

func paren(s string) string {
	if s == "" {
		return ""
	}
	return "(" + s + ")"
}

func prefixed(p, s string) string {
	if s == "" {
		return ""
	}
	return p + s
}

func joinNonEmpty(sep string, parts ...string) string {
	return strings.Join(slices.DeleteFunc(parts, func(s string) bool { return s == "" }), sep)
}

// pointsTable is the HTML twin of the terminal table, with every main metric.
func pointsTable(v *view) htmlTable {
	t := htmlTable{Head: []string{"config"}}
	for _, k := range v.varying {
		t.Head = append(t.Head, xTitle(k))
	}
	for _, m := range v.metrics {
		t.Head = append(t.Head, metricTitle(m))
	}
	t.Head = append(t.Head, "reps")
	for _, pv := range v.points {
		row := v.rowStart(pv, "–")
		for _, m := range v.metrics {
			if st, ok := pv.sum[m]; ok {
				row = append(row, formatStat(m, st))
			} else {
				row = append(row, "–")
			}
		}
		row = append(row, repsText(pv.p))
		t.Rows = append(t.Rows, row)
	}
	return t
}

func stageTables(v *view) []stageTable {
	var out []stageTable
	for _, cfg := range v.configs {
		cells, _, _ := stageTotals(v, cfg)
		if len(cells) == 0 {
			continue
		}
		total := map[string]uint64{}
		for _, c := range cells {
			total[c.Stage] += c.Packets
		}
		st := stageTable{Config: cfg}
		for _, c := range cells {
			row := stageRow{Stage: c.Stage, CPU: fmt.Sprintf("cpu%d", c.CPU),
				Packets: formatStat("x_count", results.Stat{Median: float64(c.Packets), N: 1}),
				Devices: strings.Join(c.Devices, ", "), NsPerPkt: "–", Share: "–"}
			if total[c.Stage] > 0 {
				row.Share = fmt.Sprintf("%.1f%%", 100*float64(c.Packets)/float64(total[c.Stage]))
			}
			if c.Packets > 0 && c.Ns > 0 {
				row.NsPerPkt = fmt.Sprintf("%.0f", float64(c.Ns)/float64(c.Packets))
			}
			st.Rows = append(st.Rows, row)
		}
		out = append(out, st)
	}
	return out
}

var unsafeName = regexp.MustCompile(`[^a-z0-9]+`)

// fileName makes a chart's file name from its parts ("r1-delivered_pps-vs-size.png").
func fileName(prefix string, parts ...string) string {
	name := strings.ToLower(strings.Join(parts, "-"))
	name = strings.Trim(unsafeName.ReplaceAllString(name, "-"), "-")
	return prefix + "-" + name + ".png"
}

// drawFigures renders every chart the run has data for, in reading order: headline metrics
// against each swept key, softirq/IRQ counts, CPU breakdown per config, stage placement per config.
func drawFigures(outDir, prefix string, v *view) ([]figure, error) {
	var figs []figure
	emit := func(c *chart, err error, file, caption string) error {
		if err != nil || c == nil {
			return err
		}
		if err := c.save(filepath.Join(outDir, file)); err != nil {
			return err
		}
		figs = append(figs, figure{File: file, Caption: caption})
		return nil
	}
	metrics := append(slices.Clone(v.metrics), extraPlotted...)
	for _, m := range metrics {
		if len(v.varying) == 0 {
			c, err := metricByConfig(v, m)
			cap := fmt.Sprintf("%s per config: median of measured reps, bars show min–max.", metricTitle(m))
			if err := emit(c, err, fileName(prefix, m, "by-config"), cap); err != nil {
				return nil, err
			}
			continue
		}
		for _, k := range v.varying {
			c, err := metricVsX(v, m, k)
			cap := fmt.Sprintf("%s vs %s: median of measured reps, bars show min–max.", metricTitle(m), xTitle(k))
			switch m {
			case results.MetricNetRX:
				cap = fmt.Sprintf("NET_RX softirqs raised during one repetition (all CPUs) vs %s: the overlay raises one per stage.", xTitle(k))
			case results.MetricIRQs:
				cap = fmt.Sprintf("Interrupts during one repetition (/proc/interrupts, all CPUs, all kinds) vs %s. The lab's veth underlay raises no device IRQ: receive steering shows as CAL and RES IPIs (table \"Interrupts and softirqs\").", xTitle(k))
			case results.IRQMetric("cal"):
				cap = fmt.Sprintf("Function-call IPIs (CAL) during one repetition (all CPUs) vs %s: RPS hands packets to another CPU's backlog with one.", xTitle(k))
			}
			if err := emit(c, err, fileName(prefix, m, "vs", k), cap); err != nil {
				return nil, err
			}
		}
	}
	for _, cfg := range v.configs {
		c, err := cpuBreakdown(v, cfg)
		cap := fmt.Sprintf("%s: receiver CPU time per CPU (mean of measured reps), split into softirq, irq, system, user, steal and idle.", cfg)
		if err := emit(c, err, fileName(prefix, "cpu", cfg), cap); err != nil {
			return nil, err
		}
	}
	{
		c, err := costStack(v)
		cap := "Where each config's CPU time per delivered packet goes (medians): receive stages (NET_RX time the stage probe charged to each), NET_RX time charged to no stage, and everything outside NET_RX (the sender, the application, syscalls, and on a shared machine anyone else's work). The bar's height is cost_cpu_ns."
		if err := emit(c, err, fileName(prefix, "cost-stack"), cap); err != nil {
			return nil, err
		}
	}
	for _, cfg := range v.configs {
		c, err := stagePlacement(v, cfg)
		cap := fmt.Sprintf("%s: which CPU processed each receive stage's packets, over all measured reps and points.", cfg)
		if err := emit(c, err, fileName(prefix, "stages", cfg), cap); err != nil {
			return nil, err
		}
	}
	return figs, nil
}
