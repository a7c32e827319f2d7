package bench

import (
	"context"
	"time"

	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/results"
)

// StudyConfigs are the chapter-2 comparison: the host network against both overlay styles.
var StudyConfigs = []Config{{Style: lab.StyleNative, Mode: ModeVanilla}, {Style: lab.StyleDocker, Mode: ModeVanilla}, {Style: lab.StyleFlannel, Mode: ModeVanilla}}

// Study is the characterization study of the dissertation's chapter 2 as a list of scenarios:
// TCP throughput vs message size and vs flows, UDP packet rate vs datagram size (remote-sender
// emulation, and iperf3 for the papers' 8 KB case), latency, and the two applications.
func Study(quick bool) []Scenario {
	if quick {
		d := 2 * time.Second
		return []Scenario{
			{Name: "tcp", Sizes: []int{65536}, Flows: []int{1, 4}, Duration: d, Reps: 2, Warmup: 1},
			// The XDP injector at a load no config saturates (the overlay tax per packet,
			// cost_receive_ns overlay/native), and flat out (each path's capacity).
			{Name: "udp-inject", Sizes: []int{64, 1024}, Flows: []int{1}, Rates: []int{40000, 0}, Duration: d, Reps: 2, Warmup: 1},
			{Name: "pingpong", Sizes: []int{64}, Flows: []int{1}, Duration: d, Reps: 2, Warmup: 0, Proto: "tcp"},
		}
	}
	d := 5 * time.Second
	return []Scenario{
		{Name: "tcp", Sizes: []int{4096, 16384, 65536}, Flows: []int{1}, Duration: d, Reps: 3, Warmup: 1},
		{Name: "tcp", Sizes: []int{65536}, Flows: []int{1, 2, 4, 8}, Duration: d, Reps: 3, Warmup: 1},
		{Name: "udp-inject", Sizes: []int{16, 64, 256, 1024, 1400}, Flows: []int{1}, Rates: []int{40000, 0}, Duration: d, Reps: 3, Warmup: 1},
		{Name: "udp-inject", Sizes: []int{64}, Flows: []int{1}, Rates: []int{20000, 50000, 100000, 200000, 0}, Duration: d, Reps: 3, Warmup: 1},
		{Name: "udp-inject", Sizes: []int{64}, Flows: []int{1, 2, 4, 8}, Duration: d, Reps: 3, Warmup: 1},
		{Name: "udp", Sizes: []int{64, 1024, 8192}, Flows: []int{1}, Duration: d, Reps: 3, Warmup: 1},
		{Name: "pingpong", Sizes: []int{64, 1024}, Flows: []int{1}, Duration: d, Reps: 3, Proto: "tcp"},
		{Name: "pingpong", Sizes: []int{64}, Flows: []int{1}, Duration: d, Reps: 3, Proto: "udp"},
		{Name: "memcached", Duration: d, Reps: 3, Warmup: 1},
		{Name: "nginx", Duration: d, Reps: 3, Warmup: 1},
	}
}

// EstimatedDuration is a rough upper bound of a scenario's measuring time on the configs.
func (s Scenario) EstimatedDuration(configs int) time.Duration {
	_ = s.Validate()
	n := len(s.points()) * (s.Reps + s.Warmup) * configs
	return time.Duration(n) * (s.Duration + 1500*time.Millisecond)
}

// RunStudy runs the characterization study suite.
func RunStudy(ctx context.Context, quick bool, base Options) ([]*results.Run, []string, error) {
	return RunSuite(ctx, "study", quick, base)
}
