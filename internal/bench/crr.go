package bench

import (
	"context"
	"net"
	"strconv"

	"github.com/peregrine-net/peregrine/internal/results"
	"github.com/peregrine-net/peregrine/internal/workload/crr"
)

// crr is TCP_CRR (internal/workload/crr): connections/s and connect-to-close latency.

// crrPort is where the crr server listens in the receiver (when the bed names no server port).
const crrPort = 9300

func (s *Scenario) crr(ctx context.Context, p pair, size, flows int, m map[string]float64) (any, error) {
	port := p.serverPort
	if port == 0 {
		port = crrPort
	}
	connect := p.connect
	if connect == "" {
		connect = net.JoinHostPort(p.receiver.AddrOnly(), strconv.Itoa(port))
	}
	r, err := crr.Run(ctx, crr.Config{ServerNS: p.receiver.Netns, Listen: net.JoinHostPort(p.receiver.AddrOnly(), strconv.Itoa(port)),
		ClientNS: p.sender.Netns, Connect: connect, Clients: flows, Response: size, Duration: s.Duration})
	m["connections_per_s"] = r.PerSec
	m[results.MetricRequests] = r.PerSec
	m[results.MetricLatencyP50] = r.P50Us
	m["latency_p90_us"] = r.P90Us
	m[results.MetricLatencyP99] = r.P99Us
	m["failures_count"] = float64(r.Failures)
	return r, err
}
