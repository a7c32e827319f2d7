package results

import (
	"fmt"
	"strings"
)

// FlowPairs is how many client/server pairs a bench run's flows are spread over: every
// scenario runs between one sender and one receiver endpoint, so "N flows" are N connections
// (or source ports) of one client process and one server process, not N pairs as in the
// dissertation's testbed (a pair per container, 1–80 pairs on 20 cores per host).
const FlowPairs = 1

// flowNotePrefix starts the note FlowSharingNote writes, so it is added once.
const flowNotePrefix = "flows share "

// FlowSharingNote says how a run's flows map onto client/server pairs and cores, or "" when no
// point has more than one flow. The report shows it next to the table; SummarizeAll records it
// in the run's notes.
func FlowSharingNote(r *Run) string {
	maxFlows := 0
	for _, p := range r.Points {
		if f := int(p.X["flows"]); f > maxFlows {
			maxFlows = f
		}
	}
	if maxFlows < 2 {
		return ""
	}
	var how string
	switch r.Scenario.Workload {
	case WorkloadIperf3TCP, WorkloadIperf3UDP:
		how = "iperf3 -P N: one client and one server process, N connections"
	case WorkloadInjectUDP:
		how = "one injector sending N flows (source ports) to one sink socket"
	case WorkloadMemcached, WorkloadNginx:
		how = "one load client opening N connections to one server"
	default:
		how = "N connections between one client and one server"
	}
	cores := ""
	if r.Env.CPUs > 0 && maxFlows > r.Env.CPUs {
		cores = fmt.Sprintf("; with %d CPUs, up to %d flows share the cores too (the dissertation ran one pair per container, 1–80 pairs on 20-core hosts)", r.Env.CPUs, maxFlows)
	}
	return fmt.Sprintf("%s%d client/server pair (%s)%s", flowNotePrefix, FlowPairs, how, cores)
}

// addFlowNote records FlowSharingNote in the run's notes, once.
func (r *Run) addFlowNote() {
	note := FlowSharingNote(r)
	if note == "" {
		return
	}
	for _, n := range r.Notes {
		if strings.HasPrefix(n, flowNotePrefix) {
			return
		}
	}
	r.Notes = append(r.Notes, note)
}
