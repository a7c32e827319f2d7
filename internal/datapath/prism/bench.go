package prism

import (
	"maps"
	"strconv"

	"github.com/peregrine-net/peregrine/internal/datapath"
)

// BenchOptions: containers do not come and go during a benchmark (no agent, no rescans), and
// without rules of the user's the measured workload's port is high priority in both
// directions (replies cross the overlay too).
func (mode) BenchOptions(b datapath.BenchContext, given map[string]string) map[string]string {
	m := maps.Clone(given)
	if m == nil {
		m = map[string]string{}
	}
	m[OptAgent] = "false"
	if m[OptRules] == "" && m[OptRulesFile] == "" && b.Port != 0 {
		p := strconv.Itoa(b.Port)
		m[OptRules] = "dport=" + p + ";sport=" + p
	}
	return m
}
