package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"time"

	"github.com/peregrine-net/peregrine/internal/lab"
	"github.com/peregrine-net/peregrine/internal/results"
	"github.com/peregrine-net/peregrine/internal/workload"
	"github.com/peregrine-net/peregrine/internal/workload/inject"
	"github.com/peregrine-net/peregrine/internal/workload/udpsink"
)

// pair is where one measurement runs: a sender and a receiver endpoint of one lab.
type pair struct {
	lab        *lab.Lab
	sender     lab.Node
	receiver   lab.Node
	senderHost string // namespace of the sender's host (the injector sends on its underlay)
	appCPUs    []int
	senderCPUs []int
	// bgSender, bgReceiver carry the background (LP) traffic when the scenario has one.
	bgSender, bgReceiver lab.Node
	// connect, set, is the ClusterIP:port the client connects to, translated to the
	// receiver's serverPort.
	connect    string
	serverPort int
	nginxPort  int // where nginx listens (0: its default)
}

// sinkPort is where the udp-inject sink listens in the receiver.
const sinkPort = 9000

// tools each scenario needs on PATH.
func (s *Scenario) tools() []string {
	switch s.Name {
	case "tcp", "udp":
		return []string{"iperf3", "taskset"}
	case "pingpong", "underload":
		return []string{"sockperf", "taskset", "chrt"}
	case "memcached":
		return []string{"memcached", "taskset"}
	case "nginx", "nginx-close":
		return []string{"nginx", "wrk", "taskset"}
	}
	return nil
}

// measure runs one repetition of the scenario at point x and returns its metrics and the
// tool's own result as raw JSON.
func (s *Scenario) measure(ctx context.Context, p pair, x map[string]float64) (map[string]float64, json.RawMessage, error) {
	size, flows := int(x["size"]), int(x["flows"])
	d := s.Duration
	srv, cli := cpuList(p.appCPUs), cpuList(p.senderCPUs)
	m := map[string]float64{}
	var raw any
	var err error
	bg := s.startBackground(ctx, p)
	switch s.Name {
	case "tcp", "udp":
		var r workload.Iperf3Result
		r, err = workload.Iperf3Config{ServerNS: p.receiver.Netns, ServerAddr: p.receiver.AddrOnly(), ClientNS: p.sender.Netns,
			Port: p.serverPort, Connect: p.connect,
			Duration: d, UDP: s.Name == "udp", Streams: flows, Length: size, ServerCPUs: srv, ClientCPUs: cli}.Run(ctx)
		raw = r
		m[results.MetricThroughput] = r.ReceivedBps
		m[results.MetricSentBps] = r.SentBps
		if r.UDP != nil {
			m[results.MetricDeliveredPPS] = r.UDP.DeliveredPPS
			if r.DurationS > 0 {
				m[results.MetricSentPPS] = float64(r.UDP.PacketsSent) / r.DurationS
			}
			m[results.MetricLoss] = r.UDP.LostPercent / 100
		} else {
			m[results.MetricRetransmits] = float64(r.Retransmits)
		}
	case "udp-inject":
		rate := s.Rate
		if r, ok := x["rate"]; ok {
			rate = int(r)
		}
		raw, err = s.injectUDP(ctx, p, size, flows, rate, m)
	case "pingpong", "underload":
		mode := workload.SockperfPingPong
		if s.Name == "underload" {
			mode = workload.SockperfUnderLoad
		}
		var r workload.SockperfResult
		r, err = workload.SockperfConfig{ServerNS: p.receiver.Netns, ServerAddr: p.receiver.AddrOnly(), ClientNS: p.sender.Netns,
			Port: p.serverPort, Connect: p.connect,
			Mode: mode, TCP: s.Proto == "tcp", MsgSize: size, Duration: d, MPS: s.Rate, ServerCPUs: srv, ClientCPUs: cli,
			RTPriority: s.hpRTPriority()}.Run(ctx)
		raw = r
		m[results.MetricLatencyAvg] = r.AvgUs
		m[results.MetricLatencyP50] = r.P50Us
		m["latency_p90_us"] = r.P90Us
		m[results.MetricLatencyP99] = r.P99Us
		m[results.MetricLatencyP999] = r.P999Us
		m["latency_max_us"] = r.MaxUs
	case "memcached":
		var r workload.MemcachedResult
		r, err = workload.MemcachedConfig{ServerNS: p.receiver.Netns, ServerAddr: p.receiver.AddrOnly(), ClientNS: p.sender.Netns,
			Duration: d, Connections: flows, ValueSize: size, ServerCPUs: srv, ClientCPUs: cli}.Run(ctx)
		raw = r
		m[results.MetricRequests] = r.OpsPerSec
		m[results.MetricLatencyAvg] = r.AvgUs
		m[results.MetricLatencyP50] = r.P50Us
		m[results.MetricLatencyP99] = r.P99Us
		m[results.MetricLatencyP999] = r.P999Us
	case "nginx", "nginx-close":
		var r workload.WrkResult
		r, err = workload.NginxConfig{ServerNS: p.receiver.Netns, ServerAddr: p.receiver.AddrOnly(), ClientNS: p.sender.Netns,
			Port: p.nginxPort, Duration: d, FileSize: size, Connections: flows, ServerCPUs: srv, ClientCPUs: cli, Close: s.Name == "nginx-close",
			Workers: len(p.appCPUs)}.Run(ctx) // one nginx worker per application CPU (--app-cpus 1-4: 4)
		raw = r
		m[results.MetricRequests] = r.RequestsPerSec
		m[results.MetricLatencyAvg] = r.LatencyAvgUs
		m[results.MetricLatencyP50] = r.P50Us
		m[results.MetricLatencyP99] = r.P99Us
	case "crr":
		raw, err = s.crr(ctx, p, size, flows, m)
	case "udp-flows":
		raw, err = s.udpFlows(ctx, p, size, flows, m)
	default:
		return nil, nil, fmt.Errorf("scenario %q has no workload", s.Name)
	}
	if bg != nil {
		err = errors.Join(err, bg.wait(m))
	}
	b, _ := json.Marshal(raw)
	return m, b, err
}

// injectUDP runs the remote-sender emulation: a sink in the receiver, frames injected on the
// sending host's underlay (VXLAN-encapsulated for overlay styles, plain UDP for native).
func (s *Scenario) injectUDP(ctx context.Context, p pair, size, flows, rate int, m map[string]float64) (any, error) {
	if p.lab == nil {
		return nil, fmt.Errorf("udp-inject needs a lab peregrine built (it computes the frames from its spec); not on given namespaces or the real flannel style")
	}
	spec := p.lab.Spec
	rcvAddr := netip.MustParseAddr(p.receiver.AddrOnly())
	sink, err := udpsink.Listen(udpsink.Config{Netns: p.receiver.Netns, Addr: rcvAddr, Port: sinkPort,
		Duration: s.Duration + 2*time.Second, IdleTimeout: 500 * time.Millisecond, CPU: firstCPU(p.appCPUs)})
	if err != nil {
		return nil, fmt.Errorf("udp sink in %s: %w", p.receiver.Netns, err)
	}
	defer sink.Close()
	type sinkOut struct {
		st  udpsink.Stats
		err error
	}
	sc := make(chan sinkOut, 1)
	go func() {
		st, err := sink.Run(ctx)
		sc <- sinkOut{st, err}
	}()
	cfg := inject.Config{
		Netns: p.senderHost, Device: "eth0",
		DstMAC: inject.MAC(spec.UnderlayMAC(2)), SrcIP: spec.HostAddr(1).Addr(), DstIP: spec.HostAddr(2).Addr(),
		InnerDstPort: sinkPort, PayloadSize: size, Flows: flows, Rate: float64(rate), Duration: s.Duration,
		CPU: firstCPU(p.senderCPUs), Method: injectorFor(s.Injector, rate),
	}
	switch spec.Style {
	case lab.StyleNative:
		cfg.Plain = true
	default:
		cfg.DstPort, cfg.VNI = uint16(spec.VXLANPort), uint32(spec.VNI)
		cfg.InnerSrcIP, cfg.InnerDstIP = netip.MustParseAddr(p.sender.AddrOnly()), rcvAddr
		cfg.InnerSrcMAC = inject.MAC(spec.ContainerMAC(1, 1))
		cfg.InnerDstMAC = inject.MAC(spec.ContainerMAC(2, 1)) // docker: the container behind br0
		if spec.Style == lab.StyleFlannel {
			cfg.InnerDstMAC = inject.MAC(spec.VTEPMAC(2)) // flannel: routed, so flannel.1's own MAC
		}
	}
	ist, ierr := inject.Run(ctx, cfg)
	so := <-sc
	out := struct {
		Inject inject.Stats  `json:"inject"`
		Sink   udpsink.Stats `json:"sink"`
	}{ist, so.st}
	if ierr != nil {
		return out, fmt.Errorf("injector: %w", ierr)
	}
	if so.err != nil {
		return out, fmt.Errorf("udp sink: %w", so.err)
	}
	secs := ist.Duration.Seconds()
	if secs <= 0 {
		return out, fmt.Errorf("injector ran for no time")
	}
	m[results.MetricSentPPS] = float64(ist.Sent) / secs
	m[results.MetricDeliveredPPS] = float64(so.st.Received) / secs
	m[results.MetricSent] = float64(ist.Sent)
	m[results.MetricDelivered] = float64(so.st.Received)
	if ist.Sent > 0 {
		m[results.MetricLoss] = 1 - float64(so.st.Received)/float64(ist.Sent)
	}
	m[senderCPUKey] = float64(ist.SenderCPUNs)
	if ist.ProgRuns > 0 {
		m[senderRunsKey], m[senderRunNsKey] = float64(ist.ProgRuns), float64(ist.ProgRunNs)
	}
	if ist.XmitDropped > 0 {
		m["xmit_dropped_count"] = float64(ist.XmitDropped)
	}
	m[results.MetricThroughput] = float64(so.st.Bytes) * 8 / secs
	m["reordered_count"] = float64(so.st.Reordered)
	m["socket_drops_count"] = float64(so.st.SocketDrops)
	if so.st.Received == 0 {
		return out, fmt.Errorf("the receiver got none of %d injected packets: the frames do not match the lab (check style, MACs, VNI)", ist.Sent)
	}
	return out, nil
}

func cpuList(cpus []int) string {
	s := ""
	for i, c := range cpus {
		if i > 0 {
			s += ","
		}
		s += strconv.Itoa(c)
	}
	return s
}

func firstCPU(cpus []int) *int {
	if len(cpus) == 0 {
		return nil
	}
	c := cpus[0]
	return &c
}

// Metrics the injector reports about itself, moved into the rep's own fields by takeSender.
const (
	senderCPUKey   = "sender_cpu_ns"
	senderRunsKey  = "sender_prog_runs"
	senderRunNsKey = "sender_prog_run_ns"
)

// takeSender moves the injector's CPU time and its XDP program's statistics out of the metrics
// into Rep.SenderCPUNs and Rep.Programs.
func takeSender(rep *results.Rep) {
	if v, ok := rep.Metrics[senderCPUKey]; ok {
		rep.SenderCPUNs = uint64(v)
		delete(rep.Metrics, senderCPUKey)
	}
	runs, ok1 := rep.Metrics[senderRunsKey]
	ns, ok2 := rep.Metrics[senderRunNsKey]
	delete(rep.Metrics, senderRunsKey)
	delete(rep.Metrics, senderRunNsKey)
	if ok1 && ok2 && runs > 0 {
		rep.Programs = append(rep.Programs, results.ProgramRuns{Name: inject.ProgName, Role: results.RoleSender, Type: "XDP", Runs: uint64(runs), RunNs: uint64(ns)})
	}
}
