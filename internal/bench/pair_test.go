package bench

import "testing"

// The pair options are checked against the scenario before anything is built.
func TestValidatePair(t *testing.T) {
	for _, c := range []struct {
		s  Scenario
		ok bool
	}{
		{Scenario{Name: "tcp", SameNode: true}, true},
		{Scenario{Name: "tcp", ViaService: true}, true},
		{Scenario{Name: "crr", ViaService: true}, true},
		{Scenario{Name: "crr", SameNode: true}, false},
		{Scenario{Name: "pingpong", ViaService: true, Proto: "tcp", ProxyMode: "nftables"}, true},
		{Scenario{Name: "pingpong", ViaService: true, Proto: "udp"}, false},
		{Scenario{Name: "udp", ViaService: true}, false},
		{Scenario{Name: "tcp", ViaService: true, ProxyMode: "ipvs"}, false},
		{Scenario{Name: "tcp", ProxyMode: "iptables"}, false},
		{Scenario{Name: "tcp", SameNode: true, ViaService: true}, true},
		{Scenario{Name: "crr", SameNode: true, ViaService: true, IPv6: true}, true},
		{Scenario{Name: "udp", SameNode: true, ViaService: true}, false},
		{Scenario{Name: "tcp", SameNode: true, ViaService: true, Background: "tcp"}, false},
		{Scenario{Name: "udp-inject", SameNode: true}, false},
		{Scenario{Name: "memcached", SameNode: true}, false},
	} {
		err := c.s.Validate()
		if (err == nil) != c.ok {
			t.Errorf("%+v: %v, want ok %v", c.s, err, c.ok)
		}
		if err == nil && c.s.containers() != 2 {
			t.Errorf("%+v: %d containers per host, want 2", c.s, c.s.containers())
		}
	}
	s := Scenario{Name: "tcp", ViaService: true}
	if err := s.Validate(); err != nil || s.ProxyMode != "iptables" {
		t.Fatalf("default proxy mode %q (%v)", s.ProxyMode, err)
	}
}
