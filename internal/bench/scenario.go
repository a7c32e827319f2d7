package bench

import (
	"cmp"
	"errors"
	"fmt"
	"github.com/peregrine-net/peregrine/internal/workload/flows"
	"sort"
	"strings"
	"time"

	"github.com/peregrine-net/peregrine/internal/results"
)

// InjectorAuto picks udp-inject's sender per point: XDP flat out, AF_PACKET at an offered rate.
const InjectorAuto = "auto"

// injectorFor is the sender method of a udp-inject point at rate (packets/s, 0 = flat out).
func injectorFor(injector string, rate int) string {
	if injector != InjectorAuto && injector != "" {
		return injector
	}
	if rate > 0 {
		return "packet"
	}
	return "xdp"
}

// Scenario is one workload swept over message sizes and flow counts.
type Scenario struct {
	Name     string        // tcp, udp, udp-inject, pingpong, underload, memcached, nginx, nginx-close, crr
	Sizes    []int         // message / datagram / value / file size in bytes
	Flows    []int         // parallel flows (iperf3 -P, injector flows, client connections)
	Duration time.Duration // per measurement
	Reps     int           // measured repetitions per point and config
	Warmup   int           // discarded repetitions before them
	Proto    string        // pingpong/underload: tcp or udp
	Rate     int           // underload: messages/s; udp-inject: packets/s (0 = as fast as possible)
	HogCPUs  []int         // CPUs kept busy by a spinning thread during each measurement (a hotspot)
	// Background is bulk low-priority traffic during the measurement (PRISM's experiment): iperf3
	// "tcp" or "udp" between a second container pair on the same hosts; "" or "none" for none.
	Background string
	// HPRealTime runs the latency workload (sockperf, both ends) at real-time priority: on a
	// machine with fewer cores than roles it stands in for the latency application's own core,
	// so the tail shows what the network path queues rather than the scheduler.
	HPRealTime bool
	// Injector is how udp-inject sends: "xdp" (live-frame XDP, cheap per frame), "packet"
	// (AF_PACKET sendmmsg) or "auto" (default): xdp flat out, packet at an offered rate. The XDP
	// sender cannot pace smoothly: each BPF_PROG_RUN call sleeps in its page pool's teardown, so
	// it reaches a rate only with bursts a veth ring cannot take (measured: 15-37 % of the
	// offered rate, or drops), while AF_PACKET holds any rate it can afford exactly.
	Injector string
	// Rates sweeps udp-inject's offered load (packets/s, 0 = as fast as the sender goes): each
	// is a point with x "rate". Empty: one point at Rate.
	Rates []int
	// SameNode measures between two pods of one node (the sender's host), not across the
	// overlay; ViaService has the client connect to a ClusterIP (a flannel lab with kube-proxy
	// style Services, mode ProxyMode) whose one backend is the receiver. tcp/udp/pingpong/
	// underload only (the tools that take a connect address), not both at once.
	SameNode, ViaService bool
	ProxyMode            string // with ViaService: iptables (default) or nftables
	// IPv6 measures between the pods' IPv6 addresses on a dual-stack flannel lab (lab up
	// --ipv6: IPv6 inside the overlay, the IPv4 underlay outside). tcp and udp (iperf3).
	IPv6 bool
	// IPv6Underlay (with IPv6) builds the lab with real flannel's dual-stack layout (lab up
	// --ipv6-underlay): the pods' IPv6 on flannel-v6.1 over the nodes' IPv6 addresses.
	IPv6Underlay bool
}

// scenarioDef is the fixed part of each named scenario.
type scenarioDef struct {
	workload string
	primary  string // the metric the table and ratios lead with
	sizes    []int
	flows    []int
	help     string
}

var scenarios = map[string]scenarioDef{
	"tcp": {results.WorkloadIperf3TCP, results.MetricThroughput, []int{65536}, []int{1},
		"iperf3 TCP stream(s) container to container; throughput at the receiver"},
	"udp": {results.WorkloadIperf3UDP, results.MetricDeliveredPPS, []int{64}, []int{1},
		"iperf3 UDP at full speed; packets delivered to the receiving socket"},
	"udp-inject": {results.WorkloadInjectUDP, results.MetricDeliveredPPS, []int{64}, []int{1},
		"remote-sender emulation: pre-encapsulated VXLAN frames injected on the sending host's underlay; packets delivered to the receiving socket"},
	"pingpong": {results.WorkloadSockperfPingPong, results.MetricLatencyP99, []int{64}, []int{1},
		"sockperf ping-pong: round-trip/2 latency percentiles"},
	"underload": {results.WorkloadSockperfUnderLoad, results.MetricLatencyP99, []int{64}, []int{1},
		"sockperf under-load at a fixed message rate: latency percentiles"},
	"memcached": {results.WorkloadMemcached, results.MetricRequests, []int{64}, []int{8},
		"memcached with a 90/10 get/set load client: ops/s, average and p99 latency"},
	"crr": {"tcp-crr", results.MetricRequests, []int{1024}, []int{1},
		"TCP_CRR: connect, 64 B request, response of the size, close, again (our Go client and server); connections/s and connect-to-close latency percentiles"},
	"nginx": {results.WorkloadNginx, results.MetricRequests, []int{1024}, []int{16},
		"nginx serving a static file to wrk: requests/s and latency percentiles"},
	"udp-flows": {"udp-flows", results.MetricDeliveredPPS, []int{64}, []int{1},
		"many concurrent UDP flows (--flows up to 200000: distinct port pairs, each opened by an echoed probe, then sent to in turn as fast as the client goes); packets delivered to the server's sockets"},
	"nginx-close": {"nginx-close", results.MetricRequests, []int{1024}, []int{1},
		"nginx as above, each request on a new connection (wrk -H 'Connection: close': connect, request, response, server closes first): short-connection requests/s and latency percentiles"},
}

// ScenarioNames lists the known scenarios.
func ScenarioNames() []string {
	var ns []string
	for n := range scenarios {
		ns = append(ns, n)
	}
	sort.Strings(ns)
	return ns
}

// ScenarioHelp describes every scenario, one per line.
func ScenarioHelp() string {
	var b strings.Builder
	for _, n := range ScenarioNames() {
		fmt.Fprintf(&b, "  %-11s %s\n", n, scenarios[n].help)
	}
	return b.String()
}

// Validate fills defaults and checks the scenario.
func (s *Scenario) Validate() error {
	def, ok := scenarios[s.Name]
	if !ok {
		return fmt.Errorf("unknown scenario %q: choose one of %s", s.Name, strings.Join(ScenarioNames(), ", "))
	}
	if len(s.Sizes) == 0 {
		s.Sizes = def.sizes
	}
	if len(s.Flows) == 0 {
		s.Flows = def.flows
	}
	if s.Duration == 0 {
		s.Duration = 5 * time.Second
	}
	if s.Duration < time.Second || s.Duration%time.Second != 0 {
		return fmt.Errorf("duration %s: use whole seconds, at least 1s (the tools take integer seconds)", s.Duration)
	}
	if s.Reps == 0 {
		s.Reps = 3
	}
	if s.Reps < 1 || s.Reps > 100 {
		return fmt.Errorf("repetitions %d out of range 1..100", s.Reps)
	}
	if s.Warmup < 0 || s.Warmup > 10 {
		return fmt.Errorf("warm-up repetitions %d out of range 0..10", s.Warmup)
	}
	if s.Proto == "" {
		s.Proto = "tcp"
	}
	if s.Proto != "tcp" && s.Proto != "udp" {
		return fmt.Errorf("protocol %q: use tcp or udp", s.Proto)
	}
	if err := s.validatePair(); err != nil {
		return err
	}
	for _, sz := range s.Sizes {
		// nginx's size is the file served (EZPath's nginx runs use 1 KB and 1 MB files); the
		// others' is a message.
		if (s.Name == "nginx" || s.Name == "nginx-close") && sz >= 16 && sz <= 64<<20 {
			continue
		}
		if sz < 16 || sz > 65536 {
			return fmt.Errorf("size %d out of range 16..65536 bytes (nginx: files up to 64 MiB)", sz)
		}
		if (s.Name == "udp-inject") && sz > 1400 {
			return fmt.Errorf("size %d too large for udp-inject: the frame must fit the 1500-byte underlay (max 1400)", sz)
		}
	}
	for _, f := range s.Flows {
		if s.Name == "udp-flows" && f >= 1 && f <= flows.MaxFlows {
			continue
		}
		if f < 1 || f > 128 {
			return fmt.Errorf("flows %d out of range 1..128 (udp-flows: up to %d)", f, flows.MaxFlows)
		}
	}
	if s.Injector == "" {
		s.Injector = InjectorAuto
	}
	if s.Injector != InjectorAuto && s.Injector != "xdp" && s.Injector != "packet" {
		return fmt.Errorf("injector %q: use auto, xdp or packet", s.Injector)
	}
	if len(s.Rates) > 0 && s.Name != "udp-inject" {
		return fmt.Errorf("a rate sweep is for udp-inject only (use --rate for %s)", s.Name)
	}
	for _, r := range s.Rates {
		if r < 0 {
			return fmt.Errorf("rate %d is negative", r)
		}
	}
	if s.Name == "underload" && s.Rate == 0 {
		s.Rate = 10000
	}
	if err := s.validateBackground(); err != nil {
		return err
	}
	if s.HPRealTime && s.Name != "pingpong" && s.Name != "underload" {
		return fmt.Errorf("--hp-rt applies to the sockperf scenarios (pingpong, underload), not %s", s.Name)
	}
	return nil
}

// hpRealTimePriority is the SCHED_FIFO priority of the latency workload under --hp-rt: above
// every normal task, below the kernel's own real-time threads (50 and up by convention).
const hpRealTimePriority = 10

func (s *Scenario) hpRTPriority() int {
	if s.HPRealTime {
		return hpRealTimePriority
	}
	return 0
}

func (s *Scenario) def() scenarioDef { return scenarios[s.Name] }

// points lists the sweep's X values in order.
func (s *Scenario) points() []map[string]float64 {
	var xs []map[string]float64
	for _, f := range s.Flows {
		for _, sz := range s.Sizes {
			if len(s.Rates) == 0 {
				xs = append(xs, map[string]float64{"size": float64(sz), "flows": float64(f)})
			}
			for _, r := range s.Rates {
				xs = append(xs, map[string]float64{"size": float64(sz), "flows": float64(f), "rate": float64(r)})
			}
		}
	}
	return xs
}

// EstimatedDuration is a rough upper bound of a scenario's measuring time on the configs.
func (s Scenario) EstimatedDuration(configs int) time.Duration {
	_ = s.Validate()
	n := len(s.points()) * (s.Reps + s.Warmup) * configs
	return time.Duration(n) * (s.Duration + 1500*time.Millisecond)
}

// repLimit bounds one repetition: its duration twice over plus a minute and a half for the
// tools to start, preload and report.
func (s *Scenario) repLimit() time.Duration { return 2*s.Duration + 90*time.Second }

// validatePair checks the pair options (SameNode, ViaService) against the scenario.
func (s *Scenario) validatePair() error {
	if s.ProxyMode != "" && !s.ViaService {
		return fmt.Errorf("proxy mode %q needs --via-service", s.ProxyMode)
	}
	if s.IPv6 {
		if s.Name != "tcp" && s.Name != "udp" && s.Name != "crr" {
			// sockperf (pingpong, underload) takes IPv6 only from 3.8 on; the distributions'
			// 3.7 exits with its usage on an IPv6 address.
			return fmt.Errorf("--ipv6: scenario %s is not supported (tcp, udp: iperf3; crr)", s.Name)
		}
	}
	if !s.SameNode && !s.ViaService {
		return nil
	}
	// Both together: the client is the Service backend's node mate (testbed.pickPair), so the
	// ClusterIP's translation takes every connection to a pod of the client's own node.
	if s.Background != "" && s.Background != "none" {
		return errors.New("--same-node/--via-service: no background pair (the lab's second pods are taken)")
	}
	switch s.Name {
	case "tcp", "udp", "pingpong", "underload":
	case "crr": // its client takes a connect address; one-backend Service, so every connection lands on the receiver
		if !s.ViaService {
			return errors.New("--same-node: scenario crr needs --via-service (tcp, udp, pingpong, underload)")
		}
	default:
		return fmt.Errorf("--same-node/--via-service: scenario %s is not supported (tcp, udp, pingpong, underload; crr with --via-service)", s.Name)
	}
	if s.ViaService {
		s.ProxyMode = cmp.Or(s.ProxyMode, "iptables")
		if s.ProxyMode != "iptables" && s.ProxyMode != "nftables" {
			return fmt.Errorf("proxy mode %q: iptables or nftables", s.ProxyMode)
		}
		if s.Name == "udp" || (s.Name != "tcp" && s.Name != "crr" && s.Proto != "tcp") {
			if s.IPv6 {
				return errors.New("--via-service: TCP only (the lab's Services are TCP): with --ipv6 use tcp or crr")
			}
			return errors.New("--via-service: TCP only (the lab's Services are TCP): use tcp, crr, or pingpong/underload with --proto tcp")
		}
	}
	return nil
}
