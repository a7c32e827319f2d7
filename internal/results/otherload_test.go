package results

import (
	"strings"
	"testing"
)

func TestOtherLoadNote(t *testing.T) {
	rep := func(other float64, warm bool, names map[string]float64) Rep {
		c := map[string]float64{}
		for n, v := range names {
			c["other."+n] = v
		}
		return Rep{Warmup: warm, Metrics: map[string]float64{MetricOtherCPU: other}, Counters: c}
	}
	quiet := &Run{Points: []Point{{Reps: []Rep{rep(0.02, false, nil), rep(0.9, true, map[string]float64{"cc1": 0.9})}}}}
	if n := OtherLoadNote(quiet); n != "" {
		t.Errorf("quiet run (noise only in a warm-up) noted: %q", n)
	}
	if n := OtherLoadNote(&Run{Points: []Point{{Reps: []Rep{{Metrics: map[string]float64{}}}}}}); n != "" {
		t.Errorf("run without the measurement noted: %q", n)
	}
	busy := &Run{Points: []Point{
		{Reps: []Rep{rep(0.05, false, nil), rep(1.2, false, map[string]float64{"go": 1.1, "cc1": 0.05})}},
		{Reps: []Rep{rep(0.3, false, map[string]float64{"cc1": 0.3}), rep(0, false, nil)}},
	}}
	n := OtherLoadNote(busy)
	for _, want := range []string{"during 2 of 4 measured reps", "at most 1.20 cores", "largest: go 1.10, cc1 0.30"} {
		if !strings.Contains(n, want) {
			t.Errorf("note %q lacks %q", n, want)
		}
	}
}
