package report

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/peregrine-net/peregrine/internal/results"
)

// tableMetrics caps the metric columns so the table fits a terminal.
const tableMetrics = 4

// Table writes each run as a header and an aligned table: one row per point with the config,
// the X values that vary, the main metrics as median [min–max], and the primary metric's ratio
// against the baseline config.
func Table(w io.Writer, runs ...*results.Run) error {
	for i, run := range runs {
		if i > 0 {
			if _, err := fmt.Fprintln(w); err != nil {
				return err
			}
		}
		if err := table(w, run); err != nil {
			return err
		}
	}
	return nil
}

func table(w io.Writer, run *results.Run) error {
	v := newView(run)
	var b strings.Builder
	fmt.Fprintf(&b, "run %s: %s (%s)  kernel %s, %d CPUs\n", run.ID, run.Scenario.Name, run.Scenario.Workload,
		orDash(run.Env.Kernel), run.Env.CPUs)
	if !run.Complete {
		msg := "INCOMPLETE run"
		if run.Error != "" {
			msg += ": " + run.Error
		}
		fmt.Fprintf(&b, "!! %s: numbers below cover only what was measured\n", msg)
	}
	if a := arrangementText(run.Arrangement); a != "" {
		fmt.Fprintf(&b, "arrangement: %s\n", a)
	}
	if len(v.fixed) > 0 {
		fmt.Fprintf(&b, "fixed: %s\n", results.XKey(v.fixed))
	}
	if n := results.FlowSharingNote(run); n != "" {
		fmt.Fprintf(&b, "note: %s\n", n)
	}
	if n := results.OtherLoadNote(run); n != "" {
		fmt.Fprintf(&b, "!! %s\n", n)
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}
	if len(v.points) == 0 {
		_, err := fmt.Fprintln(w, "(no points measured)")
		return err
	}

	metrics := v.metrics[:min(len(v.metrics), tableMetrics)]
	showRatio := v.primary != "" && len(v.configs) > 1
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := []string{"CONFIG"}
	for _, k := range v.varying {
		head = append(head, strings.ToUpper(k))
	}
	for _, m := range metrics {
		head = append(head, strings.ToUpper(metricTitle(m)))
	}
	head = append(head, "REPS")
	if showRatio {
		head = append(head, fmt.Sprintf("%s VS %s", strings.ToUpper(metricTitle(v.primary)), v.baseline))
	}
	fmt.Fprintln(tw, strings.Join(head, "\t"))
	for _, pv := range v.points {
		row := v.rowStart(pv, "-")
		for _, m := range metrics {
			if st, ok := pv.sum[m]; ok {
				row = append(row, formatStat(m, st))
			} else {
				row = append(row, "-")
			}
		}
		row = append(row, repsText(pv.p))
		if showRatio {
			row = append(row, ratioCell(v, pv.p))
		}
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if err := irqTableText(w, v); err != nil {
		return err
	}
	if err := reorderTableText(w, v); err != nil {
		return err
	}
	return costTable(w, v)
}

func ratioCell(v *view, p *results.Point) string {
	if p.Config == v.baseline {
		return "(baseline)"
	}
	r, ok := v.ratio(v.primary, p)
	if !ok {
		return "-"
	}
	return formatRatio(r) + " " + changeWord(r)
}

// repsText is "3" or "2/3 (1 failed)": failed reps are worth seeing at a glance.
func repsText(p *results.Point) string {
	var measured, failed int
	for _, r := range p.Reps {
		switch {
		case r.Warmup:
		case r.Error != "":
			failed++
		default:
			measured++
		}
	}
	if failed == 0 {
		return fmt.Sprint(measured)
	}
	return fmt.Sprintf("%d/%d (%d failed)", measured, measured+failed, failed)
}

func arrangementText(a results.Arrangement) string {
	var parts []string
	add := func(name string, cpus []int) {
		if len(cpus) > 0 {
			parts = append(parts, name+" "+cpuList(cpus))
		}
	}
	add("sender CPU", a.SenderCPUs)
	add("IRQ CPU", a.IRQCPUs)
	add("stage CPUs", a.StageCPUs)
	add("app CPU", a.AppCPUs)
	if a.Note != "" {
		if len(parts) == 0 {
			return a.Note
		}
		return strings.Join(parts, ", ") + "; " + a.Note
	}
	return strings.Join(parts, ", ")
}

func cpuList(cpus []int) string {
	s := slices.Clone(cpus)
	slices.Sort(s)
	parts := make([]string, len(s))
	for i, c := range s {
		parts[i] = fmt.Sprint(c)
	}
	return strings.Join(parts, ",")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
