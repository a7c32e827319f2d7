package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/peregrine-net/peregrine/internal/bench/testbed"
	"github.com/peregrine-net/peregrine/internal/datapath"
	"github.com/peregrine-net/peregrine/internal/workload"
)

// PRISM's experiment: a latency-sensitive (HP) workload measured alone and while bulk (LP)
// traffic runs between a second container pair on the same two hosts, so both share the
// receiving host's NIC, VXLAN and backlog stages. The LP throughput is recorded too: a
// prioritisation that starves bulk traffic is no win.

// MetricLPThroughput is the background (LP) traffic's received throughput during the measurement.
const MetricLPThroughput = "lp_throughput_bps"

// Background rates. TCP is unlimited (2 streams, as in the design notes' measurement); UDP is
// paced to a rate that keeps the receive core busy but not livelocked (the paper's LP used
// 60-70 % of the processing core), with MTU-sized datagrams.
const (
	bgTCPStreams = 2
	bgUDPBitrate = 1_000_000_000
	bgUDPLength  = 1400
	bgPort       = 5301 // away from the measured workload's ports
	bgLead       = 500 * time.Millisecond
)

func (s *Scenario) validateBackground() error {
	switch s.Background {
	case "", "none":
		s.Background = ""
		return nil
	case "tcp", "udp":
	default:
		return fmt.Errorf("background %q: use tcp, udp or none", s.Background)
	}
	switch s.Name {
	case "pingpong", "underload", "memcached", "nginx":
		return nil
	}
	return fmt.Errorf("--background applies to the latency scenarios (pingpong, underload, memcached, nginx), not %s", s.Name)
}

// containers per host: a second pair carries the background.
func (s *Scenario) containers() int {
	if s.Background != "" || s.SameNode || s.ViaService {
		return 2 // a second pod per host (lab Services need 3 pods in all)
	}
	return 1
}

type background struct {
	done chan struct{}
	res  workload.Iperf3Result
	err  error
}

// startBackground starts the LP traffic and lets it ramp up; nil when the scenario has none.
// It runs a little longer than the measurement so the whole measurement is under load.
func (s *Scenario) startBackground(ctx context.Context, p pair) *background {
	if s.Background == "" {
		return nil
	}
	bg := &background{done: make(chan struct{})}
	cfg := workload.Iperf3Config{ServerNS: p.bgReceiver.Netns, ServerAddr: p.bgReceiver.AddrOnly(), ClientNS: p.bgSender.Netns,
		Port: bgPort, Duration: s.Duration + 2*time.Second, Streams: bgTCPStreams}
	if s.Background == "udp" {
		cfg.UDP, cfg.Streams, cfg.Bitrate, cfg.Length = true, 1, bgUDPBitrate, bgUDPLength
	}
	// The LP client shares the sender CPUs (the remote host) with the HP client; the LP server is
	// left to the scheduler, as the paper ran it on cores of its own.
	cfg.ClientCPUs = cpuList(p.senderCPUs)
	go func() {
		defer close(bg.done)
		bg.res, bg.err = cfg.Run(ctx)
	}()
	select {
	case <-time.After(bgLead):
	case <-bg.done:
	}
	return bg
}

// wait collects the background's throughput into m.
func (bg *background) wait(m map[string]float64) error {
	<-bg.done
	if bg.err != nil {
		return fmt.Errorf("background iperf3: %w", bg.err)
	}
	m[MetricLPThroughput] = bg.res.ReceivedBps
	m["lp_retransmits"] = float64(bg.res.Retransmits)
	if bg.res.UDP != nil {
		m["lp_loss"] = bg.res.UDP.LostPercent / 100
	}
	return nil
}

// modeExtra is the attach options of a mode in a benchmark: what --mode-opt gave (each mode
// gets the keys it declares), completed by the mode's own bench defaults (datapath.BenchDefaulter:
// e.g. prism makes the measured workload's port high priority in both directions, so
// `bench compare --modes vanilla,prism` measures the sync path without further setup).
// Through a Service (--via-service) the server listens on the Service's target port, which is
// what a node's programs see after kube-proxy's translation, so that is the port singled out.
func (o *Options) modeExtra(mode, style string) map[string]string {
	m := datapath.FilterOptions(mode, o.ModeExtra)
	port := o.Scenario.port()
	if o.Scenario.ViaService && port != 0 {
		port = testbed.ServiceTargetPort(style)
	}
	if md, err := datapath.Lookup(mode); err == nil {
		if bd, ok := md.(datapath.BenchDefaulter); ok {
			m = bd.BenchOptions(datapath.BenchContext{Port: port}, m)
		}
	}
	return m
}

// port is the measured workload's server port (0: none that a mode should single out).
func (s *Scenario) port() int {
	switch s.Name {
	case "pingpong", "underload":
		return 11111 // sockperf's default
	case "memcached":
		return 11211
	case "nginx", "nginx-close":
		return 8080
	}
	return 0
}
