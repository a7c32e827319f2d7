package ezpath

import (
	"fmt"
	"sort"
	"time"
)

// The controller (the paper's "real-time migration" logic, docs/modes/ezpath.md): every interval it reads the switches' flow registers, turns them into per-pair byte
// rates, and
//   - offloads a pair active (rate >= MinRate) for Active consecutive intervals, highest score
//     (rate x class weight) first, while every switch table it needs stays within the budget;
//   - un-offloads an automatically offloaded pair idle for Idle consecutive intervals;
//   - leaves everything else, and every pair of class "never", on the overlay, saying why.
// Manual offloads (`peregrine ezpath offload`) are never undone by the controller.

// FlowView is one flow as `ezpath flows` shows it.
type FlowView struct {
	Key     FlowKey `json:"key"`
	Src     string  `json:"src"` // container names
	Dst     string  `json:"dst"`
	Rate    float64 `json:"rate_bytes_per_s"`
	Bytes   uint64  `json:"bytes"`
	Packets uint64  `json:"packets"`
	State   string  `json:"state"` // offloaded | overlay
	Where   string  `json:"where"` // the path it takes
	Class   string  `json:"class"`
	Note    string  `json:"note,omitempty"`
}

// pairKey names an unordered pair.
func pairKey(a, b string) string {
	if a > b {
		a, b = b, a
	}
	return a + " <-> " + b
}

// pairStat is one pair's traffic in the last interval (both directions).
type pairStat struct {
	A, B  string
	Rate  float64
	Class string
}

type streak struct{ active, idle int }

// planner holds the hysteresis state between intervals.
type planner struct {
	cfg     Config
	streaks map[string]*streak
}

func newPlanner(cfg Config) *planner { return &planner{cfg: cfg, streaks: map[string]*streak{}} }

// plan is one interval's decisions.
type plan struct {
	Offload   []pairStat
	Unoffload []Pair
	Refused   map[string]string // pair key -> why it stays on the overlay
}

// step updates the streaks with this interval's stats and decides. offloaded are the pairs on
// the switch path now; entries lists the switch entries a pair needs (for the budget).
func (p *planner) step(stats []pairStat, offloaded []Pair, entries func(a, b string) []torEntry) plan {
	out := plan{Refused: map[string]string{}}
	seen := map[string]bool{}
	for _, s := range stats {
		k := pairKey(s.A, s.B)
		seen[k] = true
		st := p.streaks[k]
		if st == nil {
			st = &streak{}
			p.streaks[k] = st
		}
		if s.Rate >= p.cfg.MinRate {
			st.active, st.idle = st.active+1, 0
		} else {
			st.active, st.idle = 0, st.idle+1
		}
	}
	isOff := map[string]bool{}
	for _, o := range offloaded {
		k := pairKey(o.A, o.B)
		isOff[k] = true
		st := p.streaks[k]
		if st == nil {
			st = &streak{}
			p.streaks[k] = st
		}
		if !seen[k] {
			st.active, st.idle = 0, st.idle+1
		}
	}
	for k, st := range p.streaks {
		if !seen[k] && !isOff[k] {
			st.active, st.idle = 0, st.idle+1
			if st.idle > p.cfg.Idle+p.cfg.Active {
				delete(p.streaks, k) // forgotten: a flow that ended long ago
			}
		}
	}
	// Un-offload first: the room it frees is there for this interval's candidates.
	var keep []Pair
	for _, o := range offloaded {
		if o.By == "auto" && p.streaks[pairKey(o.A, o.B)].idle >= p.cfg.Idle {
			out.Unoffload = append(out.Unoffload, o)
		} else {
			keep = append(keep, o)
		}
	}
	used := map[torEntry]bool{}
	for _, o := range keep {
		for _, e := range entries(o.A, o.B) {
			used[e] = true
		}
	}
	var cands []pairStat
	for _, s := range stats {
		k := pairKey(s.A, s.B)
		switch {
		case isOff[k]:
		case s.Class == "never":
			out.Refused[k] = "class never: stays on the overlay"
		case p.streaks[k].active >= p.cfg.Active:
			cands = append(cands, s)
		}
	}
	sort.SliceStable(cands, func(i, j int) bool {
		return cands[i].Rate*classWeights[cands[i].Class] > cands[j].Rate*classWeights[cands[j].Class]
	})
	for _, c := range cands {
		next := map[torEntry]bool{}
		for e := range used {
			next[e] = true
		}
		for _, e := range entries(c.A, c.B) {
			next[e] = true
		}
		if over := overBudget(next, p.cfg.Budget()); over != "" {
			out.Refused[pairKey(c.A, c.B)] = "switch table budget full (" + over + "): stays on the overlay"
			continue
		}
		used = next
		out.Offload = append(out.Offload, c)
	}
	return out
}

// overBudget names the first switch table whose entries exceed budget, "" if none.
func overBudget(entries map[torEntry]bool, budget int) string {
	count := map[string]int{}
	for e := range entries {
		count[fmt.Sprintf("tor%d %s", e.ToR, tableName(e))]++
	}
	var names []string
	for n, c := range count {
		if c > budget {
			names = append(names, fmt.Sprintf("%s needs %d > budget %d", n, c, budget))
		}
	}
	sort.Strings(names)
	if len(names) == 0 {
		return ""
	}
	return names[0]
}

// sampler turns cumulative flow registers into rates.
type sampler struct {
	last map[FlowKey]sample
}

type sample struct {
	bytes uint64
	at    time.Time
}

func newSampler() *sampler { return &sampler{last: map[FlowKey]sample{}} }

// rate returns the flow's byte rate since its last sample (0 for its first).
func (s *sampler) rate(k FlowKey, bytes uint64, now time.Time) float64 {
	prev, ok := s.last[k]
	s.last[k] = sample{bytes, now}
	if !ok || bytes < prev.bytes || !now.After(prev.at) {
		return 0
	}
	return float64(bytes-prev.bytes) / now.Sub(prev.at).Seconds()
}
