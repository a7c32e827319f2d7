package bench

import (
	"math"
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
		{"egress", "local"}: 50, {"ingress", "hit"}: 5, {"ingress", "other"}: 40,
		{"ingress", "miss"}: 300, {"ingress", "budget"}: 200}},
		entries: map[string]map[string]int{"fastpath": {"flows": 7}}}
	var rep results.Rep
	after.record(before, &rep)
	want := map[string]float64{"mode.fastpath.egress.hit": 297, "mode.fastpath.egress.miss": 2,
		"mode.fastpath.egress.hit_pct": 99, "mode.fastpath.egress.learned": 3, "mode.fastpath.flows": 7,
		"mode.fastpath.ingress.hit": 0, "mode.fastpath.ingress.other": 40, "mode.fastpath.ingress.hit_pct": 0,
		"mode.fastpath.ingress.hit_pct_admitted": 0}
	for k, v := range want {
		if rep.Counters[k] != v {
			t.Errorf("%s = %v, want %v (all: %v)", k, rep.Counters[k], v, rep.Counters)
		}
	}
	if _, ok := rep.Counters["mode.fastpath.egress.hit_pct_admitted"]; ok {
		t.Errorf("egress refused no flow, yet has an admitted hit rate: %v", rep.Counters)
	}
	before.packets["fastpath"][[2]string{"ingress", "hit"}] = 0 // 5 hits, 300 misses of which 200 refused
	after.record(before, &rep)
	if p, a := rep.Counters["mode.fastpath.ingress.hit_pct"], rep.Counters["mode.fastpath.ingress.hit_pct_admitted"]; math.Abs(p-500.0/305) > 1e-9 || math.Abs(a-500.0/105) > 1e-9 {
		t.Errorf("ingress hit rates %v, %v: want 5/305 and 5/105 %%", p, a)
	}
	(*modeSample)(nil).record(before, &rep) // no testbed modes: nothing, no panic
}
