package workload

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Sockperf test modes.
const (
	SockperfPingPong  = "ping-pong"  // one message in flight: pure round-trip latency
	SockperfUnderLoad = "under-load" // fixed send rate, every ReplyEvery-th message timed
)

// SockperfConfig describes one sockperf latency run.
type SockperfConfig struct {
	ServerNS   string `json:"server_ns"`
	ServerAddr string `json:"server_addr"`
	ClientNS   string `json:"client_ns"`
	Port       int    `json:"port"` // default 11111
	// Connect is the ip:port the client connects to when it is not the server's own (a
	// Service's ClusterIP:port translated to ServerAddr:Port).
	Connect  string        `json:"connect,omitempty"`
	Mode     string        `json:"mode"`        // SockperfPingPong (default) or SockperfUnderLoad
	TCP      bool          `json:"tcp"`         // default UDP, sockperf's default
	MsgSize  int           `json:"msg_size"`    // -m, 14..65507; default 64
	Duration time.Duration `json:"duration_ns"` // whole seconds; includes sockperf's 400 ms warm-up
	// MPS is the message rate (--mps). Required for under-load (sockperf's default there is
	// 10000); 0 in ping-pong means as fast as replies come back.
	MPS int `json:"mps,omitempty"`
	// ReplyEvery is --reply-every for under-load (0: sockperf's default, 100).
	ReplyEvery int    `json:"reply_every,omitempty"`
	ServerCPUs string `json:"server_cpus,omitempty"`
	ClientCPUs string `json:"client_cpus,omitempty"`
	// RTPriority runs both ends under SCHED_FIFO at this priority (chrt -f), 0 = the normal
	// scheduler. A latency application on a core of its own never waits for the CPU; on a
	// machine with fewer cores than roles, real-time priority is the nearest stand-in, and it
	// leaves in the tail what the network path itself queues.
	RTPriority int `json:"rt_priority,omitempty"`
}

// SockperfResult holds the latency summary sockperf prints, in microseconds. The figures
// are round-trip times halved by sockperf ("latency" = RTT/2).
type SockperfResult struct {
	Mode             string  `json:"mode"`
	Protocol         string  `json:"protocol"`
	MsgSize          int     `json:"msg_size"`
	ValidDurationS   float64 `json:"valid_duration_s"` // measured part, without warm-up
	SentMessages     int64   `json:"sent_messages"`
	ReceivedMessages int64   `json:"received_messages"`
	Observations     int64   `json:"observations"` // latency samples behind the percentiles
	Dropped          int64   `json:"dropped"`
	Duplicated       int64   `json:"duplicated"`
	OutOfOrder       int64   `json:"out_of_order"`
	AvgUs            float64 `json:"avg_us"`
	StdDevUs         float64 `json:"stddev_us"`
	MinUs            float64 `json:"min_us"`
	P25Us            float64 `json:"p25_us"`
	P50Us            float64 `json:"p50_us"`
	P75Us            float64 `json:"p75_us"`
	P90Us            float64 `json:"p90_us"`
	P99Us            float64 `json:"p99_us"`
	P999Us           float64 `json:"p99_9_us"`
	P9999Us          float64 `json:"p99_99_us"`
	MaxUs            float64 `json:"max_us"`
}

func (c *SockperfConfig) defaults() error {
	c.Port = cmp.Or(c.Port, 11111)
	c.Mode = cmp.Or(c.Mode, SockperfPingPong)
	if c.Mode != SockperfPingPong && c.Mode != SockperfUnderLoad {
		return fmt.Errorf("sockperf: unknown mode %q (want %s or %s)", c.Mode, SockperfPingPong, SockperfUnderLoad)
	}
	c.MsgSize = cmp.Or(c.MsgSize, 64)
	if c.MsgSize < 14 || c.MsgSize > 65507 {
		return fmt.Errorf("sockperf: message size %d outside 14..65507", c.MsgSize)
	}
	c.Duration = cmp.Or(c.Duration, 10*time.Second)
	if c.Mode == SockperfUnderLoad && c.MPS == 0 {
		c.MPS = 10000
	}
	if c.ServerAddr == "" {
		return errors.New("sockperf: server address is required")
	}
	if _, _, err := connectTo(c.Connect, c.ServerAddr, c.Port); err != nil {
		return fmt.Errorf("sockperf: %w", err)
	}
	if c.RTPriority < 0 || c.RTPriority > 99 {
		return fmt.Errorf("sockperf: real-time priority %d outside 1..99 (0 = normal scheduling)", c.RTPriority)
	}
	return nil
}

// Run starts `sockperf server`, runs the client test and parses its summary.
func (c SockperfConfig) Run(ctx context.Context) (SockperfResult, error) {
	if err := prepare(c.defaults, c.ServerNS, c.ClientNS); err != nil {
		return SockperfResult{}, err
	}
	port := strconv.Itoa(c.Port)
	proto := "udp"
	common := []string{"-i", c.ServerAddr, "-p", port}
	if c.TCP {
		proto = "tcp"
		common = append(common, "--tcp")
	}
	var rt []string
	if c.RTPriority > 0 {
		rt = []string{"chrt", "-f", strconv.Itoa(c.RTPriority)}
	}
	srv, err := startServer(ctx, c.ServerNS, "sockperf server", c.ServerCPUs,
		append(append(rt, "sockperf", "server"), common...), proto, c.Port)
	if err != nil {
		return SockperfResult{}, err
	}
	defer srv.stop()

	secs := secondsCeil(c.Duration)
	host, cport, _ := connectTo(c.Connect, c.ServerAddr, c.Port)
	argv := append(append(rt, "sockperf", c.Mode), "-i", host, "-p", cport)
	if c.TCP {
		argv = append(argv, "--tcp")
	}
	argv = append(argv, "-t", strconv.Itoa(secs), "-m", strconv.Itoa(c.MsgSize))
	if c.MPS > 0 {
		argv = append(argv, "--mps", strconv.Itoa(c.MPS))
	}
	if c.Mode == SockperfUnderLoad && c.ReplyEvery > 0 {
		argv = append(argv, "--reply-every", strconv.Itoa(c.ReplyEvery))
	}
	stdout, stderr, err := runClient(ctx, c.ClientNS, "sockperf client", c.ClientCPUs, argv, time.Duration(secs)*time.Second)
	if err != nil {
		return SockperfResult{}, err
	}
	// sockperf 3.7 exits 0 even when it could not connect or got no reply, so a missing
	// summary is how failure shows.
	res, err := ParseSockperf(stdout + "\n" + stderr)
	if err != nil {
		return SockperfResult{}, toolError("sockperf client", c.ClientNS, err, stderr, stdout)
	}
	res.Mode, res.MsgSize = c.Mode, c.MsgSize
	res.Protocol = strings.ToUpper(proto)
	return res, nil
}

var (
	spValid = regexp.MustCompile(`\[Valid Duration\] RunTime=([\d.]+) sec; SentMessages=(\d+); ReceivedMessages=(\d+)`)
	spAvg   = regexp.MustCompile(`avg-latency=([\d.]+) \(std-dev=([\d.]+)\)`)
	spDrop  = regexp.MustCompile(`# dropped messages = (\d+); # duplicated messages = (\d+); # out-of-order messages = (\d+)`)
	spObs   = regexp.MustCompile(`Total (\d+) observations`)
	spPct   = regexp.MustCompile(`---> percentile ([\d.]+) =\s*([\d.]+)`)
	spMax   = regexp.MustCompile(`---> <MAX> observation =\s*([\d.]+)`)
	spMin   = regexp.MustCompile(`---> <MIN> observation =\s*([\d.]+)`)
	spError = regexp.MustCompile(`(?i)sockperf: (ERROR.*|No messages were received.*)`)
)

// ParseSockperf parses the client output of `sockperf ping-pong|under-load` (3.7 format,
// colour escapes included). Lines from other sources may be interleaved.
func ParseSockperf(out string) (SockperfResult, error) {
	var r SockperfResult
	var haveAvg, haveP50, haveMax bool
	pcts := percentiles{25: &r.P25Us, 50: &r.P50Us, 75: &r.P75Us, 90: &r.P90Us, 99: &r.P99Us,
		99.9: &r.P999Us, 99.99: &r.P9999Us}
	sc := bufio.NewScanner(strings.NewReader(stripANSI(out)))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if m := spError.FindStringSubmatch(l); m != nil {
			return r, fmt.Errorf("sockperf: %s", strings.TrimSpace(m[1]))
		}
		if m := spValid.FindStringSubmatch(l); m != nil {
			r.ValidDurationS = atof(m[1])
			r.SentMessages, r.ReceivedMessages = atoi(m[2]), atoi(m[3])
		}
		if m := spAvg.FindStringSubmatch(l); m != nil {
			r.AvgUs, r.StdDevUs, haveAvg = atof(m[1]), atof(m[2]), true
		}
		if m := spDrop.FindStringSubmatch(l); m != nil {
			r.Dropped, r.Duplicated, r.OutOfOrder = atoi(m[1]), atoi(m[2]), atoi(m[3])
		}
		if m := spObs.FindStringSubmatch(l); m != nil {
			r.Observations = atoi(m[1])
		}
		if m := spMax.FindStringSubmatch(l); m != nil {
			r.MaxUs, haveMax = atof(m[1]), true
		}
		if m := spMin.FindStringSubmatch(l); m != nil {
			r.MinUs = atof(m[1])
		}
		if m := spPct.FindStringSubmatch(l); m != nil {
			if p, ok := pcts.set(m[1], atof(m[2])); ok && p == 50 {
				haveP50 = true
			}
		}
	}
	if !haveAvg || !haveP50 || !haveMax {
		return r, errors.New("no latency summary (avg-latency, percentile 50, <MAX>) in sockperf output")
	}
	if r.Observations == 0 {
		r.Observations = r.ReceivedMessages
	}
	return r, nil
}

func atof(s string) float64 { v, _ := strconv.ParseFloat(s, 64); return v }
func atoi(s string) int64   { v, _ := strconv.ParseInt(s, 10, 64); return v }
