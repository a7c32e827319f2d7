package probes

import (
	"testing"

	"github.com/peregrine-net/peregrine/internal/results"
)

// Link drops count only devices present before and after, and never go negative (a device
// recreated in between with a lower counter adds nothing).
func TestLinkDropsSince(t *testing.T) {
	before := linkDrops{"a/eth0": 10, "a/veth1": 5, "b/gone": 7}
	after := linkDrops{"a/eth0": 25, "a/veth1": 2, "b/new": 99}
	if got := after.since(before); got != 15 {
		t.Errorf("since = %d, want 15", got)
	}
}

// The drops metric is the backlog's plus the links'; the retransmits are the sender's
// Tcp.RetransSegs, or the receiver's where both ends share the namespace; absent inputs leave
// the metrics out instead of reporting 0.
func TestFillDrops(t *testing.T) {
	rep := &results.Rep{Counters: map[string]float64{"softnet.dropped": 3, "sender.Tcp.RetransSegs": 40, "receiver.Tcp.RetransSegs": 1}}
	fillDrops(rep, 12, true)
	if rep.Metrics[MetricDrops] != 15 || rep.Counters[counterLinkDrops] != 12 || rep.Metrics[MetricRetransSegs] != 40 {
		t.Errorf("metrics %v counters %v", rep.Metrics, rep.Counters)
	}
	one := &results.Rep{Counters: map[string]float64{"receiver.Tcp.RetransSegs": 8}}
	fillDrops(one, 0, false)
	if _, ok := one.Metrics[MetricDrops]; ok || one.Metrics[MetricRetransSegs] != 8 {
		t.Errorf("shared namespace: metrics %v", one.Metrics)
	}
	none := &results.Rep{}
	fillDrops(none, 0, false)
	if len(none.Metrics) != 0 {
		t.Errorf("nothing measured, yet %v", none.Metrics)
	}
	if results.UnitOf(MetricDrops) != results.UnitCount || !results.LowerIsBetter(MetricDrops) || !results.LowerIsBetter(MetricRetransSegs) {
		t.Error("drops/retransmits must be counts where lower is better")
	}
}
