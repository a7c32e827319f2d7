package report

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	"github.com/peregrine-net/peregrine/internal/results"
)

// keyOffloads are the ethtool features that change receive-path cost, with short names. The
// full feature list (ethtool -k prints ~60) stays in a collapsed section.
var keyOffloads = []struct{ feature, short string }{
	{"generic-receive-offload", "gro"},
	{"rx-gro-hw", "gro-hw"},
	{"rx-gro-list", "gro-list"},
	{"rx-udp-gro-forwarding", "udp-gro-fwd"},
	{"large-receive-offload", "lro"},
	{"tcp-segmentation-offload", "tso"},
	{"generic-segmentation-offload", "gso"},
	{"rx-checksumming", "rx-csum"},
	{"tx-checksumming", "tx-csum"},
}

// offloadRow is one device: its short summary under each column (config, or "all configs").
type offloadRow struct {
	Device string
	Cells  []string
}

type offloadTable struct {
	Columns []string
	Rows    []offloadRow
	Full    []offloadFull // per column, every feature
}

type offloadFull struct {
	Column string
	Lines  []string
}

// buildOffloads lays out the configs' offload states; identical states collapse into one column.
func buildOffloads(configs []results.Config) *offloadTable {
	var cols []string
	var states []map[string]map[string]bool
	for _, c := range configs {
		if len(c.Offloads) > 0 {
			cols = append(cols, c.Name)
			states = append(states, c.Offloads)
		}
	}
	if len(states) == 0 {
		return nil
	}
	same := true
	for _, s := range states[1:] {
		same = same && reflect.DeepEqual(s, states[0])
	}
	if same {
		cols, states = []string{"all configs"}, states[:1]
	}
	devSet := map[string]bool{}
	for _, s := range states {
		for d := range s {
			devSet[d] = true
		}
	}
	t := &offloadTable{Columns: cols}
	for _, d := range slices.Sorted(maps.Keys(devSet)) {
		row := offloadRow{Device: d}
		for _, s := range states {
			row.Cells = append(row.Cells, offloadSummary(s[d]))
		}
		t.Rows = append(t.Rows, row)
	}
	for i, s := range states {
		f := offloadFull{Column: cols[i]}
		for _, d := range slices.Sorted(maps.Keys(s)) {
			var on, off []string
			for _, feat := range slices.Sorted(maps.Keys(s[d])) {
				if s[d][feat] {
					on = append(on, feat)
				} else {
					off = append(off, feat)
				}
			}
			f.Lines = append(f.Lines, fmt.Sprintf("%s: on: %s; off: %s", d, orDash(strings.Join(on, " ")), orDash(strings.Join(off, " "))))
		}
		t.Full = append(t.Full, f)
	}
	return t
}

// offloadSummary is "gro on · tso off" for the key features a device reports.
func offloadSummary(feats map[string]bool) string {
	if feats == nil {
		return "–"
	}
	var parts []string
	for _, k := range keyOffloads {
		if on, ok := feats[k.feature]; ok {
			state := "off"
			if on {
				state = "on"
			}
			parts = append(parts, k.short+" "+state)
		}
	}
	if len(parts) == 0 {
		return "(no key features)"
	}
	return strings.Join(parts, " · ")
}
