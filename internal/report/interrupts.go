package report

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/peregrine-net/peregrine/internal/results"
)

// irqColumns are the interrupt figures shown beside the NET_RX softirq count, per point:
// every interrupt, device IRQs, and the two IPIs the kernel's receive steering raises.
var irqColumns = []struct{ metric, title string }{
	{results.MetricNetRX, "NET_RX softirqs"},
	{results.MetricIRQs, "IRQs (all)"},
	{results.IRQMetric("device"), "device IRQs"},
	{results.IRQMetric("cal"), "CAL IPIs"},
	{results.IRQMetric("res"), "RES IPIs"},
}

// irqLegend explains the interrupt columns (terminal and HTML).
const irqLegend = "per repetition, all CPUs, medians. IRQs (all) is every /proc/interrupts line (device IRQs, IPIs, local timer); " +
	"device IRQs are the numbered lines (a real NIC's queues; the lab's veth underlay raises none, so what appears is the machine's own devices); " +
	"CAL = function-call IPIs (RPS kicks a remote CPU's backlog with one), RES = rescheduling IPIs (wakeups)."

// irqTable is the softirq/interrupt block: one row per point, empty when the run has no
// interrupt counts (results written before irqs_count was filled).
func irqTable(v *view) htmlTable { return irqTableNamed(v, xTitle) }

// irqTableNamed is irqTable with the X columns named by xName (the terminal uses the raw keys,
// as its main table does).
func irqTableNamed(v *view, xName func(string) string) htmlTable {
	have := false
	for _, pv := range v.points {
		if _, ok := pv.sum[results.MetricIRQs]; ok {
			have = true
			break
		}
	}
	if !have {
		return htmlTable{}
	}
	t := htmlTable{Head: []string{"config"}}
	for _, k := range v.varying {
		t.Head = append(t.Head, xName(k))
	}
	for _, c := range irqColumns {
		t.Head = append(t.Head, c.title)
	}
	for _, pv := range v.points {
		row := v.rowStart(pv, "-")
		for _, c := range irqColumns {
			if st, ok := pv.sum[c.metric]; ok {
				row = append(row, fmt.Sprintf("%.0f", st.Median))
			} else {
				row = append(row, "-")
			}
		}
		t.Rows = append(t.Rows, row)
	}
	return t
}

// irqTableText prints irqTable under the terminal table.
func irqTableText(w io.Writer, v *view) error {
	return textBlock(w, "interrupts and softirqs", irqLegend, irqTableNamed(v, func(k string) string { return k }))
}

// textBlock prints a titled, explained table for the terminal; nothing when it has no rows.
func textBlock(w io.Writer, title, legend string, t htmlTable) error {
	if len(t.Rows) == 0 {
		return nil
	}
	if _, err := fmt.Fprintf(w, "\n%s: %s\n", title, legend); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := make([]string, len(t.Head))
	for i, h := range t.Head {
		head[i] = strings.ToUpper(h)
	}
	fmt.Fprintln(tw, strings.Join(head, "\t"))
	for _, r := range t.Rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}
