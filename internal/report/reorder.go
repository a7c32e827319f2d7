package report

import (
	"fmt"
	"io"
	"strings"

	"github.com/peregrine-net/peregrine/internal/results"
)

// reorderColumns are the reordering figures of a point: what arrived out of order at the
// receiver and what the sender paid for it. Modes that split a flow (mflow) or move its stages
// (falcon, rps) can reorder; every result shows it rather than leaving it to the JSON.
var reorderColumns = []struct {
	key   string // a counter, or a metric with the "metric:" prefix
	title string
}{
	{"receiver.TcpExt.TCPOFOQueue", "OFO queued (rx)"},
	{"sender.TcpExt.TCPSACKReorder", "SACK reorder (tx)"},
	{"metric:retransmits_count", "retransmits (tx)"},
	{"sender.TcpExt.TCPSpuriousRTOs", "spurious RTOs (tx)"},
	{"metric:reordered_count", "UDP reordered (rx)"},
	{"receiver.Tcp.RetransSegs", "retransmits (rx)"},
	{"softnet.dropped", "backlog drops"},
}

// reorderLegend explains the block (terminal and HTML).
const reorderLegend = "per repetition, medians. OFO queued = segments the receiving TCP put in its out-of-order queue; " +
	"SACK reorder = reordering the sender's TCP detected; retransmits and spurious RTOs are the sender's (reordering beyond " +
	"RACK's window shows up as retransmits); UDP reordered = datagrams the sink received after a later sequence number; " +
	"retransmits (rx) = the receiving side's own (request/response workloads send their data from there); backlog drops = " +
	"packets every CPU's backlog refused (netdev_max_backlog), anywhere on the machine."

// reorderTable has a row per point and only the columns some point has a non-zero value for;
// it is empty when no point reordered anything.
func reorderTable(v *view, xName func(string) string) htmlTable {
	med := make([]map[string]float64, len(v.points))
	used := make([]bool, len(reorderColumns))
	for i, pv := range v.points {
		med[i] = map[string]float64{}
		for j, c := range reorderColumns {
			m, ok := pv.p.MedianOver(func(r *results.Rep) (float64, bool) {
				if name, isMetric := strings.CutPrefix(c.key, "metric:"); isMetric {
					return r.Value(name)
				}
				v, ok := r.Counters[c.key]
				return v, ok
			})
			if !ok {
				continue
			}
			med[i][c.key] = m
			if m != 0 {
				used[j] = true
			}
		}
	}
	t := htmlTable{Head: []string{"config"}}
	for _, k := range v.varying {
		t.Head = append(t.Head, xName(k))
	}
	any := false
	for j, c := range reorderColumns {
		if used[j] {
			t.Head = append(t.Head, c.title)
			any = true
		}
	}
	if !any {
		return htmlTable{}
	}
	for i, pv := range v.points {
		row := v.rowStart(pv, "-")
		for j, c := range reorderColumns {
			if !used[j] {
				continue
			}
			if m, ok := med[i][c.key]; ok {
				row = append(row, fmt.Sprintf("%.0f", m))
			} else {
				row = append(row, "-")
			}
		}
		t.Rows = append(t.Rows, row)
	}
	return t
}

// reorderTableText prints reorderTable under the terminal table.
func reorderTableText(w io.Writer, v *view) error {
	return textBlock(w, "reordering and loss", reorderLegend, reorderTable(v, func(k string) string { return k }))
}
