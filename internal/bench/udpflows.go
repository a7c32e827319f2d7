package bench

import (
	"context"
	"errors"

	"github.com/peregrine-net/peregrine/internal/results"
	"github.com/peregrine-net/peregrine/internal/workload/flows"
)

// udp-flows is throughput against the number of concurrent flows (internal/workload/flows):
// delivered packets/s with 1 to 200 000 flows. With the modes' counters (modecounters.go) a
// result says how many of those packets a flow cache carried.
func (s *Scenario) udpFlows(ctx context.Context, p pair, size, n int, m map[string]float64) (any, error) {
	if p.connect != "" {
		return nil, errors.New("udp-flows connects to the receiver's own address (not via a Service)")
	}
	opened, _ := ctx.Value(modesFromKey{}).(func()) // the modes' hits: of the measured packets only
	r, err := flows.Run(ctx, flows.Config{ServerNS: p.receiver.Netns, ServerAddr: p.receiver.AddrOnly(),
		ClientNS: p.sender.Netns, Flows: n, Size: size, Duration: s.Duration, Opened: opened})
	m[results.MetricDeliveredPPS] = r.PPS
	m["sent_pps"] = float64(r.Sent) / max(r.DurationS, 1e-9)
	m["flows_opened_count"] = float64(r.Opened)
	m["open_s"] = r.OpenS
	return r, err
}
