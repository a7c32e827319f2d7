package results

import (
	"fmt"
	"sort"
	"strings"
)

// otherLoadNoticeable is the other processes' CPU (cores) from which a rep counts as run on a
// busy machine: a tenth of a core moves ns-per-packet figures by several percent on 2 CPUs.
const otherLoadNoticeable = 0.1

// OtherLoadNote says how many measured reps shared the machine with other processes, how much
// at most and who, or "" when none did noticeably (or the run predates the measurement).
func OtherLoadNote(r *Run) string {
	busy, total, worst := 0, 0, 0.0
	names := map[string]float64{}
	for _, p := range r.Points {
		for _, rep := range p.MeasuredReps() {
			v, ok := rep.Metrics[MetricOtherCPU]
			if !ok {
				continue
			}
			total++
			if v < otherLoadNoticeable {
				continue
			}
			busy++
			worst = max(worst, v)
			for k, c := range rep.Counters {
				if n, ok := strings.CutPrefix(k, "other."); ok {
					names[n] = max(names[n], c)
				}
			}
		}
	}
	if busy == 0 {
		return ""
	}
	var who []string
	for n := range names {
		who = append(who, n)
	}
	sort.Slice(who, func(i, j int) bool { return names[who[i]] > names[who[j]] })
	if len(who) > 3 {
		who = who[:3]
	}
	for i, n := range who {
		who[i] = fmt.Sprintf("%s %.2f", n, names[n])
	}
	return fmt.Sprintf("other processes used %.2f cores or more during %d of %d measured reps (at most %.2f cores; largest: %s): "+
		"compare configs within this run only, and prefer a quiet machine", otherLoadNoticeable, busy, total, worst, strings.Join(who, ", "))
}
