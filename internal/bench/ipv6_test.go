package bench

import "testing"

// --ipv6 measures between the pods' IPv6 addresses with iperf3 or crr, directly or through a
// Service's IPv6 ClusterIP (TCP only), or between two pods of one node (as IPv4: tcp, udp).
func TestValidateIPv6(t *testing.T) {
	for _, c := range []struct {
		s  Scenario
		ok bool
	}{
		{Scenario{Name: "tcp", IPv6: true}, true},
		{Scenario{Name: "udp", IPv6: true}, true},
		{Scenario{Name: "pingpong", IPv6: true, Proto: "tcp"}, false},
		{Scenario{Name: "crr", IPv6: true}, true},
		{Scenario{Name: "tcp", IPv6: true, SameNode: true}, true},
		{Scenario{Name: "udp", IPv6: true, SameNode: true}, true},
		{Scenario{Name: "tcp", IPv6: true, ViaService: true}, true},
		{Scenario{Name: "crr", IPv6: true, ViaService: true, ProxyMode: "nftables"}, true},
		{Scenario{Name: "udp", IPv6: true, ViaService: true}, false},      // the lab's Services are TCP
		{Scenario{Name: "pingpong", IPv6: true, ViaService: true}, false}, // sockperf 3.7: no IPv6
		{Scenario{Name: "crr", IPv6: true, SameNode: true}, false},
	} {
		if err := c.s.Validate(); (err == nil) != c.ok {
			t.Errorf("%+v: %v, want ok %v", c.s, err, c.ok)
		}
	}
}
