package workload

import "testing"

// A connect address replaces the server's address and port on the client's side only; a bad
// one is refused before anything starts.
func TestConnectTo(t *testing.T) {
	if h, p, err := connectTo("", "10.0.0.2", 5201); err != nil || h != "10.0.0.2" || p != "5201" {
		t.Fatalf("no connect address: %s %s %v", h, p, err)
	}
	if h, p, err := connectTo("198.18.255.1:80", "10.0.0.2", 47999); err != nil || h != "198.18.255.1" || p != "80" {
		t.Fatalf("ClusterIP: %s %s %v", h, p, err)
	}
	if h, p, err := connectTo("[fd70:7267:2::1]:80", "fd70:7267:0:2::2", 47999); err != nil || h != "fd70:7267:2::1" || p != "80" {
		t.Fatalf("IPv6 ClusterIP: %s %s %v", h, p, err)
	}
	for _, bad := range []string{"198.18.255.1", "[::1]:80", "[::ffff:1.2.3.4]:80", "[fe80::1%eth0]:80", "198.18.255.1:0", "x:80", "198.18.255.1:99999"} {
		if _, _, err := connectTo(bad, "10.0.0.2", 1); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	c := Iperf3Config{ServerAddr: "10.0.0.2", Connect: "nope"}
	if err := c.defaults(); err == nil {
		t.Error("iperf3 took a bad connect address")
	}
	s := SockperfConfig{ServerAddr: "10.0.0.2", Connect: "nope"}
	if err := s.defaults(); err == nil {
		t.Error("sockperf took a bad connect address")
	}
}
