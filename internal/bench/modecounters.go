package bench

import (
	"github.com/peregrine-net/peregrine/internal/bench/testbed"
	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/results"
)

// A mode's own packet counters around each repetition (the modes that export them for
// /metrics: datapath.ModeCounters, e.g. fastpath's hits, misses and learns per direction),
// summed over the testbed's hosts, so a result says how much of the measured traffic a mode
// actually took (fastpath: the hit rate of a connection churn or of 100 000 flows), and its
// tables' sizes at the end. Reading them walks nothing on the measured path and happens
// outside the measured interval.

// modesFromKey is the context key of a rep's func that restarts the modes' counts (a
// workload calls it at the end of its setup: udp-flows once its flows are open).
type modesFromKey struct{}

// modeSample is one reading: mode -> {direction, result} -> packets, and mode -> table -> entries.
type modeSample struct {
	packets map[string]map[[2]string]uint64
	entries map[string]map[string]int
}

// sampleModes reads the counters of every mode attached to the testbed's hosts (nil: none).
func sampleModes(tb *testbed.Testbed) *modeSample {
	if tb == nil || len(tb.Attached) == 0 {
		return nil
	}
	s := &modeSample{packets: map[string]map[[2]string]uint64{}, entries: map[string]map[string]int{}}
	for _, ns := range tb.Attached {
		sts, err := datapath.LoadStates(ns)
		if err != nil {
			continue
		}
		for _, st := range sts {
			m, err := datapath.Lookup(st.Mode)
			if err != nil {
				continue
			}
			mc, ok := m.(datapath.ModeCounters)
			if !ok {
				continue
			}
			pk, ent, err := mc.Counters(st)
			if err != nil {
				continue
			}
			if s.packets[st.Mode] == nil {
				s.packets[st.Mode], s.entries[st.Mode] = map[[2]string]uint64{}, map[string]int{}
			}
			for k, v := range pk {
				s.packets[st.Mode][k] += v
			}
			for k, v := range ent {
				s.entries[st.Mode][k] += v
			}
		}
	}
	return s
}

// record puts the counters' growth since before into rep.Counters as
// "mode.MODE.DIRECTION.RESULT" (packets, all hosts), the table sizes as "mode.MODE.TABLE" and,
// where the mode counts hits, "mode.MODE.DIRECTION.hit_pct": hits of the packets it saw in
// that direction, learns not counted (a learn is the normal path's packet seen a second time),
// and "hit_pct_admitted": of the packets whose flow was not refused an entry (budget, full).
func (after *modeSample) record(before *modeSample, rep *results.Rep) {
	if after == nil || before == nil {
		return
	}
	if rep.Counters == nil {
		rep.Counters = map[string]float64{}
	}
	for mode, pk := range after.packets {
		seen, refused := map[string]float64{}, map[string]float64{}
		for k, v := range pk {
			d := float64(v - min(v, before.packets[mode][k]))
			rep.Counters["mode."+mode+"."+k[0]+"."+k[1]] = d
			switch k[1] {
			case "learned", "local", "other", "closed-lost", "closed-ct": // the normal path's packet seen again; subsets of hits; not the mode's traffic
			case "budget", "full": // a subset of the misses: new flows refused an entry
				refused[k[0]] += d
			default:
				seen[k[0]] += d
			}
		}
		for dir, n := range seen {
			h, ok := pk[[2]string{dir, "hit"}]
			if !ok || n == 0 {
				continue
			}
			hits := float64(h - min(h, before.packets[mode][[2]string{dir, "hit"}]))
			rep.Counters["mode."+mode+"."+dir+".hit_pct"] = 100 * hits / n
			if r := refused[dir]; r > 0 && n > r {
				// Of the packets of flows that hold an entry (fastpath: within their pod's budget).
				rep.Counters["mode."+mode+"."+dir+".hit_pct_admitted"] = 100 * hits / (n - r)
			}
		}
		for t, n := range after.entries[mode] {
			rep.Counters["mode."+mode+"."+t] = float64(n)
		}
	}
}
