package prism

import (
	"maps"
	"strconv"

	"github.com/peregrine-net/peregrine/internal/datapath"
)

// BenchOptions: without rules of the user's the measured workload's port is high priority in
// both directions (replies cross the overlay too). The agent runs (unless --mode-opt says
// otherwise) although containers do not come and go during a benchmark: it marks the HP TCP
// flows' conntrack entries liberal, without which the gate keeps them on the normal path
// (ctliberal.go).
func (mode) BenchOptions(b datapath.BenchContext, given map[string]string) map[string]string {
	m := maps.Clone(given)
	if m == nil {
		m = map[string]string{}
	}
	if m[OptRules] == "" && m[OptRulesFile] == "" && b.Port != 0 {
		p := strconv.Itoa(b.Port)
		m[OptRules] = "dport=" + p + ";sport=" + p
	}
	return m
}
