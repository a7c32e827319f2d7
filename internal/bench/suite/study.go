package suite

import (
	"time"

	"github.com/peregrine-net/peregrine/internal/bench"
	"github.com/peregrine-net/peregrine/internal/lab"
)

// studyConfigs are the chapter-2 comparison as config strings: the host network (first: every
// ratio is against it), the Linux overlay (VXLAN in the host namespace, no containers), and both
// container overlay styles.
var studyConfigs = []string{lab.StyleNative, lab.StyleLinux, lab.StyleDocker, lab.StyleFlannel}

// StudySizes are the TCP message sizes of the full study (16 B to 64 KiB, the dissertation's
// "small packets" sweep widened to iperf3's default 128 KB class); StudyFlows its flow counts
// (the dissertation's 1 to 80 pairs; here flows of one pair, see results.FlowSharingNote).
var (
	StudySizes = []int{16, 64, 256, 1024, 4096, 16384, 65536}
	StudyFlows = []int{1, 2, 4, 8, 16, 40, 80}
)

// Study is the characterization study of the dissertation's chapter 2 as a list of scenarios:
// TCP throughput vs message size and vs flows, UDP packet rate vs datagram size (remote-sender
// emulation, and iperf3 for the papers' 8 KB case), latency, and the two applications.
func Study(quick bool) []bench.Scenario {
	if quick {
		d := 2 * time.Second
		return []bench.Scenario{
			{Name: "tcp", Sizes: []int{65536}, Flows: []int{1, 4}, Duration: d, Reps: 2, Warmup: 1},
			// An offered load no config saturates (the overlay tax per packet, cost_receive_ns
			// overlay/native; AF_PACKET, which paces exactly) and flat out (each path's
			// capacity; the XDP injector, cheap enough that the receiver saturates first).
			// 64 B only: with four configs a second size would break the 5-minute promise.
			{Name: "udp-inject", Sizes: []int{64}, Flows: []int{1}, Rates: []int{40000, 0}, Duration: d, Reps: 2, Warmup: 1},
			{Name: "pingpong", Sizes: []int{64}, Flows: []int{1}, Duration: d, Reps: 2, Warmup: 0, Proto: "tcp"},
		}
	}
	d := 5 * time.Second
	return []bench.Scenario{
		{Name: "tcp", Sizes: StudySizes, Flows: []int{1}, Duration: d, Reps: 3, Warmup: 1},
		{Name: "tcp", Sizes: []int{65536}, Flows: StudyFlows, Duration: d, Reps: 3, Warmup: 1},
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

// studySteps are the study's scenarios as suite steps, each comparing native, the Linux
// overlay, docker and flannel. A step's title becomes its run's first note.
func studySteps(quick bool) []Step {
	var out []Step
	for _, s := range Study(quick) {
		out = append(out, Step{Title: studyTitle(s), Scenario: s, Configs: studyConfigs})
	}
	return out
}

func studyTitle(s bench.Scenario) string {
	switch {
	case s.Name == "tcp" && len(s.Flows) > 1:
		return "TCP throughput vs flows (one client/server pair, iperf3 -P)"
	case s.Name == "tcp":
		return "TCP throughput vs message size (one flow)"
	case s.Name == "udp-inject" && len(s.Flows) > 1:
		return "UDP packet rate vs flows (remote-sender emulation)"
	case s.Name == "udp-inject" && len(s.Rates) > 2:
		return "UDP packet rate vs offered load (remote-sender emulation)"
	case s.Name == "udp-inject":
		return "UDP packet rate vs datagram size (remote-sender emulation)"
	case s.Name == "udp":
		return "UDP (iperf3) vs datagram size"
	case s.Name == "pingpong":
		return s.Proto + " ping-pong latency"
	}
	return s.Name
}
