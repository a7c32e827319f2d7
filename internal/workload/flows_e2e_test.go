package workload

import (
	"context"
	"testing"
	"time"

	"github.com/peregrine-net/peregrine/internal/workload/flows"
)

// udp-flows' workload across a veth: every flow opens both ways, what arrives is at most what was
// sent, the fixed ports are free again for the next run, and bad input changes nothing.
func TestUDPFlowsAcrossNamespaces(t *testing.T) {
	setupPair(t)
	opened := 0
	for _, n := range []int{1, 2000} {
		r, err := flows.Run(context.Background(), flows.Config{ServerNS: nsA, ServerAddr: addrA, ClientNS: nsB,
			Flows: n, Size: 64, Duration: time.Second, Opened: func() { opened++ }})
		if err != nil {
			t.Fatalf("%d flows: %v", n, err)
		}
		logJSON(t, r)
		if r.Opened != n || r.Received == 0 || r.Received > r.Sent || r.PPS <= 0 {
			t.Errorf("%d flows: implausible %+v", n, r)
		}
	}
	if opened != 2 {
		t.Errorf("Opened called %d times over 2 runs", opened)
	}
	for _, c := range []flows.Config{
		{ServerNS: nsA, ServerAddr: addrA, ClientNS: nsB, Flows: 0, Size: 64, Duration: time.Second},
		{ServerNS: nsA, ServerAddr: addrA, ClientNS: nsB, Flows: flows.MaxFlows + 1, Size: 64, Duration: time.Second},
		{ServerNS: nsA, ServerAddr: addrA, ClientNS: nsB, Flows: 10, Size: 8, Duration: time.Second},
		{ServerNS: nsA, ServerAddr: "not-an-ip", ClientNS: nsB, Flows: 10, Size: 64, Duration: time.Second},
		{ServerNS: "prg-twl-missing", ServerAddr: addrA, ClientNS: nsB, Flows: 10, Size: 64, Duration: time.Second},
	} {
		if _, err := flows.Run(context.Background(), c); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}
