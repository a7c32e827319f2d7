package bench

import (
	"testing"

	"github.com/peregrine-net/peregrine/internal/results"
)

// A mode's counters go into a rep as their growth over the rep, with the hit rate of what the
// mode saw per direction (learns, untouched and local-subset counts left out of it).
func TestModeCountersRecord(t *testing.T) {
	before := &modeSample{packets: map[string]map[[2]string]uint64{"fastpath": {
		{"egress", "hit"}: 100, {"egress", "miss"}: 10, {"ingress", "hit"}: 5}}}
	after := &modeSample{packets: map[string]map[[2]string]uint64{"fastpath": {
		{"egress", "hit"}: 397, {"egress", "miss"}: 12, {"egress", "proto"}: 1, {"egress", "learned"}: 3,
		{"egress", "local"}: 50, {"ingress", "hit"}: 5, {"ingress", "other"}: 40}},
		entries: map[string]map[string]int{"fastpath": {"flows": 7}}}
	var rep results.Rep
	after.record(before, &rep)
	want := map[string]float64{"mode.fastpath.egress.hit": 297, "mode.fastpath.egress.miss": 2,
		"mode.fastpath.egress.hit_pct": 99, "mode.fastpath.egress.learned": 3, "mode.fastpath.flows": 7,
		"mode.fastpath.ingress.hit": 0, "mode.fastpath.ingress.other": 40}
	for k, v := range want {
		if rep.Counters[k] != v {
			t.Errorf("%s = %v, want %v (all: %v)", k, rep.Counters[k], v, rep.Counters)
		}
	}
	if _, ok := rep.Counters["mode.fastpath.ingress.hit_pct"]; ok {
		t.Errorf("ingress saw no packet of its own, yet has a hit rate: %v", rep.Counters)
	}
	(*modeSample)(nil).record(before, &rep) // no testbed modes: nothing, no panic
}
